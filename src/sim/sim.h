/*
 * The simulator (loom-sim): runs the schedules that the planner builds (plan_build, with the
 * registry's generators, the very calls a communicator makes) on a modelled machine, and says
 * how long an allreduce (or a reduce or broadcast) takes there.
 *
 * The machine: nodes of `per_node` ranks (GPUs). Inside a node every rank has one port to the
 * node's switch (NVLink/NVSwitch class: latency loc_alpha, loc_bw bytes/s each way, full duplex);
 * across nodes every rank has one NIC (net_alpha, net_bw each way; node_nic: the node has one,
 * which its ranks share) into a fabric: a fat tree (every node's uplink carries
 * per_node·net_bw/oversub) or rail-optimised (ranks of the same local index share a rail switch and
 * meet without the uplink; other pairs cross the spine, at per_node·net_bw/oversub per node and one
 * more hop of latency). A message holds every link on its path (sender's port or NIC, the node
 * uplinks where it crosses them, receiver's port or NIC) for bytes / that link's bandwidth, first
 * come first served, so flows that share a link share its time; it arrives alpha + bytes / (its
 * slowest link) after it starts. Reductions and copies run on the rank's reduction engine (red_bw),
 * or, host model (cores > 0), on one of the node's cores (cores_shared: of the host's), which then
 * also do every node-local transfer (the memory transport copies).
 *
 * The executor: a step starts once its dependencies (the schedule's own) are done and it is in
 * the window of EXEC_LOOKAHEAD steps from the rank's first step not yet issued; a
 * receive-reduce also needs one of slices_in_flight x nchannels staging slots; sends to one peer
 * start in schedule order, receives from one peer too, and the k-th send from a to b is the k-th
 * receive of b from a: the transfer starts when both are posted. Each step costs step_alpha of
 * host time before it starts (wake_alpha more where a node, or with cores_shared the host, has
 * more ranks than cores).
 */
#ifndef LOOM_SIM_H
#define LOOM_SIM_H

#include <stdbool.h>
#include <stdint.h>

#include "loom.h"

typedef enum { SIM_FAT_TREE = 0, SIM_RAIL = 1 } sim_fabric_t;

typedef struct {
    int ranks, per_node;  /* the last node may hold fewer */
    double loc_alpha;     /* seconds, node-local message */
    double loc_bw;        /* bytes/s per rank port, each direction */
    double net_alpha;     /* seconds, message across nodes */
    double net_bw;        /* bytes/s per NIC, each direction */
    sim_fabric_t fabric;  /* fat tree or rail-optimised */
    double oversub;       /* fabric oversubscription (>= 1) */
    double spine_alpha;   /* rail: latency added by crossing the spine */
    double red_bw;        /* bytes/s of reduction (output) per rank; host model: per core */
    int cores;            /* > 0: host model with this many cores per node */
    bool cores_shared;    /* the cores are one host's, shared by every node (the test bed) */
    bool node_nic;        /* one NIC per node, shared by its ranks: net_bw is the node's */
    double step_alpha;    /* seconds of executor time per step */
    double wake_alpha;    /* per step more when a node (cores_shared: the host) has more ranks than
                             cores */
    uint64_t slice_bytes; /* the planner's slice (LOOM_SLICE_SIZE) */
    int nchannels;        /* LOOM_NCHANNELS */
    int slices_in_flight; /* LOOM_SLICES_IN_FLIGHT: receive-reduce staging slots per channel */
    uint64_t max_steps;   /* coarsen slices beyond this many steps in all (0: 6M) */
} sim_machine_t;

typedef struct {
    double time;          /* seconds from the first step's start to the last step's end */
    uint64_t steps;       /* steps simulated, all ranks */
    uint64_t slice_bytes; /* the slice used (the machine's, or coarser where steps ran over) */
} sim_result_t;

/* A machine's defaults: "h200" (8 GPUs a node, NVLink4, 400 Gb/s NICs, rail-optimised), "dev"
 * (the 2-core VM and its shared memory, one node) or "testbed" (scripts/testbed.sh on the dev
 * VM: network namespaces as nodes, one 1 Gbit/s link each, the VM's 2 cores shared by all).
 * False for an unknown name. */
bool sim_machine_preset(const char *name, sim_machine_t *m);

/* Simulates one allreduce of `bytes` (float32 elements) with registry row `algo`. */
loomResult_t sim_allreduce(const sim_machine_t *m, int algo, uint64_t bytes, sim_result_t *out);

/* The collectives the simulator runs: allreduce, and the rooted ones of the rows that have
 * them (registry.h's rooted forms: ring, tree). */
typedef enum { SIM_ALLREDUCE = 0, SIM_REDUCE = 1, SIM_BROADCAST = 2 } sim_coll_t;

/* The same for any of them; root is the reduce's or broadcast's root (ignored for allreduce). */
loomResult_t sim_collective(const sim_machine_t *m, sim_coll_t coll, int algo, uint64_t bytes,
                            int root, sim_result_t *out);

#endif
