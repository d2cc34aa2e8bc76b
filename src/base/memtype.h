/*
 * Which memory a buffer is: host, or CUDA device memory. The CUDA driver is looked up at run
 * time (dlopen of libcuda.so.1) the first time a buffer is examined, so the library loads on
 * machines without a GPU; asking the driver about a pointer initialises the driver but creates
 * no context, so host-only jobs on GPU machines stay context-free.
 */
#ifndef LOOM_BASE_MEMTYPE_H
#define LOOM_BASE_MEMTYPE_H

#include <stdbool.h>

typedef enum { MEM_HOST = 0, MEM_DEVICE = 1, MEM_MANAGED = 2 } mem_type_t;

/* The memory type of p (MEM_HOST when no CUDA driver is present or p is NULL). */
mem_type_t mem_type_of(const void *p);
/* With the device executor built: the type and, for device memory, the device ordinal, in one
 * driver call. */
mem_type_t mem_type_dev(const void *p, int *ordinal);
/* Whether a CUDA driver was found. */
bool mem_have_cuda(void);

#endif
