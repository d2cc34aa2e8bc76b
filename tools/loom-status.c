/*
 * loom-status: asks a running job's job-state service (the bootstrap root, src/core/jobstate.h)
 * for the job's table: every rank's operation (kind and seq, for how long, the peers it waits
 * on) or that it is outside calls, and the last operation it finished.
 *
 *   loom-status [-t SECONDS] [ID_FILE]        the job's unique id, as loom-perf writes it
 *                                             (default: $LOOM_ID_FILE)
 *   loom-status [-t SECONDS] HOST:PORT NRANKS a job that met at MASTER_ADDR:MASTER_PORT, with
 *                                             the same LOOM_JOB_SECRET in the environment
 *
 * The connection proves the job's secret with the handshake every loom connection uses; a
 * client without it is refused. Exit status: 0 the table was printed, 1 no table (refused,
 * unreachable, no service), 2 usage.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "jobstate.h"
#include "loom.h"

static int usage(void)
{
    fprintf(stderr, "usage: loom-status [-t SECONDS] [ID_FILE]\n"
                    "       loom-status [-t SECONDS] HOST:PORT NRANKS   (LOOM_JOB_SECRET set)\n");
    return 2;
}

int main(int argc, char **argv)
{
    /* The errors are printed below, once: loom's own log lines would repeat them. */
    setenv("LOOM_DEBUG", "NONE", 0);
    double timeout_s = 10;
    int i = 1;
    if (i + 1 < argc && strcmp(argv[i], "-t") == 0) {
        char *end;
        errno = 0;
        timeout_s = strtod(argv[i + 1], &end);
        if (errno || *end || !(timeout_s > 0 && timeout_s < 86400)) return usage();
        i += 2;
    }
    if (i < argc && (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)) {
        usage();
        return 0;
    }
    loomUniqueId id;
    if (argc - i == 2) {
        char host[256];
        snprintf(host, sizeof(host), "%s", argv[i]);
        char *colon = strrchr(host, ':');
        char *end;
        long n = strtol(argv[i + 1], &end, 10);
        if (colon == NULL || *end || n < 1 || n > (1 << 24)) return usage();
        *colon = '\0';
        if (boot_uid_master(host, colon + 1, 1, (int)n, &id) != loomSuccess) {
            fprintf(stderr, "loom-status: %s\n", loomGetLastError(NULL));
            return 1;
        }
    } else if (argc - i <= 1) {
        const char *path = argc - i == 1 ? argv[i] : getenv("LOOM_ID_FILE");
        if (path == NULL || !path[0]) return usage();
        FILE *f = fopen(path, "rb");
        if (f == NULL || fread(&id, sizeof(id), 1, f) != 1) {
            fprintf(stderr, "loom-status: cannot read a unique id from %s: %s\n", path,
                    f ? "too short" : strerror(errno));
            if (f) fclose(f);
            return 1;
        }
        fclose(f);
    } else {
        return usage();
    }
    uid_layout_t uid;
    sock_addr_t root;
    if (boot_uid_parse(&id, &uid) != loomSuccess || !sock_addr_unpack(uid.root_addr, &root)) {
        fprintf(stderr, "loom-status: not a loom unique id: %s\n", loomGetLastError(NULL));
        return 1;
    }
    char *table = NULL;
    if (js_status_query(&root, uid.secret, uid.job_id, (uint64_t)(timeout_s * 1e9), &table) !=
        loomSuccess) {
        fprintf(stderr, "loom-status: %s\n", loomGetLastError(NULL));
        return 1;
    }
    fputs(table, stdout);
    free(table);
    return 0;
}
