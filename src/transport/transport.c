#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "transport.h"

static const transport_ops_t *const transports[] = {&transport_tcp, &transport_shm};

const transport_ops_t *transport_by_name(const char *name)
{
    for (size_t i = 0; i < sizeof(transports) / sizeof(transports[0]); i++)
        if (strcmp(transports[i]->name, name) == 0) return transports[i];
    return NULL;
}

void transport_fail(transport_fail_t *f, loomResult_t code, const char *fmt, ...)
{
    if (f->failed) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->text, sizeof(f->text), fmt, ap);
    va_end(ap);
    f->failed = true;
    f->code = code;
}
