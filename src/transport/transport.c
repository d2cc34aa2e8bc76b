#include <string.h>

#include "transport.h"

static const transport_ops_t *const transports[] = {&transport_tcp, &transport_shm};

const transport_ops_t *transport_by_name(const char *name)
{
    for (size_t i = 0; i < sizeof(transports) / sizeof(transports[0]); i++)
        if (strcmp(transports[i]->name, name) == 0) return transports[i];
    return NULL;
}
