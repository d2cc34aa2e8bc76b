/* loom-info: the library's version, every parameter with its current value and meaning, the
 * allreduce algorithms LOOM_ALGO can name, and the network interface and node identity this
 * process would use. */
#include <stdio.h>
#include <string.h>

#include "comm.h"
#include "param.h"
#include "registry.h"
#include "sock.h"

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
        printf("  %c %-24s = %-12s %-6s %s\n", param_is_set((param_id_t)i) ? '*' : ' ', name,
               val[0] ? val : "(unset)", d->unit, d->doc);
    }
    printf("\nAllreduce algorithms (LOOM_ALGO; unset: chosen per call by the cost model):\n");
    for (int i = 0; i < ALGO_COUNT; i++) {
        const registry_algo_t *a = registry_get(i);
        printf("  %-12s applies: %s\n  %-12s %s\n", a->name, a->applies, "", a->doc);
    }
    printf("\nTransports built: tcp\n");
    sock_addr_t a;
    char ifname[64], as[SOCK_ADDR_STRLEN];
    if (sock_pick_address(&a, ifname, sizeof(ifname)) == loomSuccess)
        printf("Interface: %s, address %s\n", ifname, sock_addr_str(&a, as, sizeof(as)));
    else
        printf("Interface: none: %s\n", base_last_error());
    char host[HOST_NAME_LEN];
    uint64_t node = boot_node_hash(host, sizeof(host));
    printf("Node identity: %016llx (host %s%s)\n", (unsigned long long)node, host,
           param_is_set(PARAM_NODE_ID) ? ", from LOOM_NODE_ID" : ", boot id and network namespace");
    return 0;
}
