/* loom-info: the library's version, every parameter with its current value and meaning, the
 * allreduce algorithms LOOM_ALGO can name and the transports built (both from loom's own tables),
 * and the network interface and node identity this process would use. */
#include <stdio.h>
#include <string.h>

#include "loom_internal.h"

int main(int argc, char **argv)
{
    (void)argv;
    int v = 0;
    loomGetVersion(&v);
    printf("loom %d.%d.%d (version code %d)\n", v / 10000, (v / 100) % 100, v % 100, v);
    if (argc > 1) {
        printf(
            "usage: loom-info\n  Lists every LOOM_* parameter with its value and meaning, and the "
            "allreduce algorithms.\n");
        return 0;
    }
    printf("\nParameters (environment LOOM_<NAME>; '*' marks values set in the environment):\n");
    for (int i = 0; i < PARAM_COUNT; i++) {
        const param_desc_t *d = param_desc((param_id_t)i);
        char name[64];
        snprintf(name, sizeof(name), "LOOM_%s", d->name);
        const char *val = param_text((param_id_t)i);
        char range[160];
        printf("  %c %-24s = %-12s %-6s %s\n  %-27s accepts %s\n",
               param_is_set((param_id_t)i) ? '*' : ' ', name, val[0] ? val : "(unset)", d->unit,
               d->doc, "", param_range_text((param_id_t)i, range, sizeof(range)));
    }
    printf("\nAllreduce algorithms (LOOM_ALGO; unset: chosen per call by the cost model):\n");
    for (int i = 0; i < ALGO_COUNT; i++) {
        const registry_algo_t *a = registry_get(i);
        printf("  %-12s applies: %s\n  %-12s %s\n", a->name, a->applies, "", a->doc);
    }
    size_t ntp;
    const transport_ops_t *const *tps = transport_all(&ntp);
    printf("\nTransports built (LOOM_TRANSPORT; unset: shm inside a node, tcp across):\n");
    for (size_t i = 0; i < ntp; i++)
        printf("  %-12s reaches %s, moves %s memory; model hints %.1f GB/s, %.1f us\n",
               tps[i]->name, tps[i]->reach & TRANSPORT_REACH_NET ? "any node" : "this node only",
               tps[i]->mem_types & TRANSPORT_MEM_CUDA ? "host and CUDA" : "host", tps[i]->bw_GBps,
               tps[i]->latency_us);
    sock_addr_t a;
    char ifname[64], as[SOCK_ADDR_STRLEN];
    if (sock_pick_address(&a, ifname, sizeof(ifname)) == loomSuccess)
        printf("Interface: %s, address %s\n", ifname, sock_addr_str(&a, as, sizeof(as)));
    else
        printf("Interface: none: %s\n", base_last_error());
    char host[64];
    uint64_t node = loom_node_identity(host, sizeof(host));
    printf("Node identity: %016llx (host %s%s)\n", (unsigned long long)node, host,
           param_is_set(PARAM_NODE_ID) ? ", from LOOM_NODE_ID" : ", boot id and network namespace");
    return 0;
}
