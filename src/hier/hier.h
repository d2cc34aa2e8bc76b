/*
 * Hierarchical allreduce: use the fast links inside a node and the slow ones across nodes only
 * for what must cross them.
 *
 * hier (n nodes of up to g ranks; the buffer cut into g shards):
 *   1. node-local reduce-scatter: local rank j ends with its node's sum of shards j, j+g_node...
 *   2. each shard allreduced across nodes by the ranks that own it, all shards at once, so every
 *      local rank (and every NIC) carries traffic
 *   3. node-local allgather
 *   steps 2(g-1) + 2(n-1); bytes across each node's link 2(n-1)/n of the buffer (a flat ring
 *   carries 2(p-1)/p). Uneven nodes: a node with fewer ranks gives several shards to a rank.
 *
 * hier_leader (the classic hierarchical synchronisation, kept as a baseline):
 *   1. node-local reduce to the node's first rank  2. allreduce among those leaders
 *   3. node-local broadcast; the leader's link carries everything.
 *
 * ps (parameter server, the baseline that ring and hierarchy replace): everyone sends its buffer
 * to rank 0, which reduces and sends the result back: rank 0 moves 2(p-1) buffers.
 */
#ifndef LOOM_HIER_H
#define LOOM_HIER_H

#include <stdbool.h>
#include <stdint.h>

#include "ring.h"
#include "schedule.h"

void hier_allreduce(sched_t *s, uint16_t desc, const sched_topo_t *topo, uint64_t count,
                    const ring_params_t *prm, bool inplace, bool avg);
void hier_leader_allreduce(sched_t *s, uint16_t desc, const sched_topo_t *topo, uint64_t count,
                           const ring_params_t *prm, bool inplace, bool avg);
void ps_allreduce(sched_t *s, uint16_t desc, uint64_t count, const ring_params_t *prm, bool inplace,
                  bool avg);

#endif
