/*
 * libFuzzer harness over the unique id parser (boot_uid_parse, src/core/bootstrap.c): the 128
 * bytes that loomCommInitRank receives from the application, from an id file (loom-perf's
 * LOOM_ID_FILE holds the raw bytes) or from the launcher's PMIx server. A shorter input is padded
 * with zeros, as a short read of an id file would be. An id that parses must give back exactly
 * its bytes; one that does not must say why. The root's packed address (sock_addr_unpack, as
 * boot_rendezvous reads it) must either be refused or print and pack back to an address that
 * unpacks the same.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "sock.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    loomUniqueId id;
    memset(&id, 0, sizeof(id));
    memcpy(id.internal, data, size < sizeof(id) ? size : sizeof(id));
    uid_layout_t uid;
    memset(&uid, 0, sizeof(uid));
    loomResult_t r = boot_uid_parse(&id, &uid);
    if (r == loomSuccess) {
        if (memcmp(&uid, &id, sizeof(uid)) != 0) abort();
    } else if (r != loomInvalidArgument || loomGetLastError(NULL)[0] == '\0') {
        abort();
    }
    sock_addr_t a, b;
    if (sock_addr_unpack(uid.root_addr, &a)) {
        char text[SOCK_ADDR_STRLEN];
        sock_addr_str(&a, text, sizeof(text));
        if (memchr(text, '\0', sizeof(text)) == NULL) abort();
        uint8_t packed[32];
        sock_addr_pack(&a, packed);
        if (!sock_addr_unpack(packed, &b) || b.len != a.len || memcmp(&a.sa, &b.sa, a.len) != 0)
            abort();
    }
    return 0;
}
