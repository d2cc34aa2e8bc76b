#include "memtype.h"

#include <stdint.h>

#include "base.h"

#ifdef LOOM_HAVE_CUDA
/* Builds with the device executor ask the one driver table (cudrv.c) for everything. */
#include "cudrv.h"

bool mem_have_cuda(void)
{
    return cudrv_get(NULL) != NULL;
}

/* One driver call per buffer: type, managed, ordinal together. The driver's entry is taken
 * without initialising CUDA (cudrv_peek_attrs): in a process where nobody called cuInit no
 * pointer is device memory, and the call says so in nanoseconds, where after cuInit it costs
 * about 0.5 us even for host memory (perf/probes/callcost.c: 485 against 7 ns on the GPU host),
 * twice per call of a host-only job. */
mem_type_t mem_type_dev(const void *p, int *ordinal)
{
    *ordinal = -1;
    cudrv_attrs_fn attrs = p ? cudrv_peek_attrs() : NULL;
    if (attrs == NULL) return MEM_HOST;
    unsigned int type = 0, managed = 0;
    int ord = -1;
    CUpointer_attribute at[3] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                 CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    void *val[3] = {&type, &managed, &ord};
    /* Host memory unknown to CUDA answers with an error (CUDA_ERROR_NOT_INITIALIZED where
     * CUDA is not initialised): it is plain host memory. */
    if (attrs(3, at, val, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS) return MEM_HOST;
    /* (device memory means someone initialised CUDA: the table the caller uses next is there) */
    if (cudrv_get(NULL) == NULL) return MEM_HOST;
    if (managed) return MEM_MANAGED;
    if (type != CU_MEMORYTYPE_DEVICE) return MEM_HOST;
    *ordinal = ord;
    return MEM_DEVICE;
}

mem_type_t mem_type_of(const void *p)
{
    int ord;
    return mem_type_dev(p, &ord);
}

#else
/* Builds without the CUDA toolkit still recognise device pointers (to refuse them clearly):
 * the two driver calls they need, found at run time. Values from cuda.h, stable since CUDA 4. */
#include <dlfcn.h>
#include <pthread.h>

#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_IS_MANAGED 8
#define CU_MEMORYTYPE_DEVICE 2

typedef int (*cu_attr_fn)(void *, int, unsigned long long);

static pthread_once_t mem_once = PTHREAD_ONCE_INIT;
static cu_attr_fn cu_attr;

static void mem_load(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) return;
    /* Not initialised here (see the CUDA build's mem_type_dev): where nobody else called cuInit,
     * the driver answers CUDA_ERROR_NOT_INITIALIZED at once and the buffer is host memory. */
    cu_attr_fn attr = (cu_attr_fn)dlsym(h, "cuPointerGetAttribute");
    if (attr == NULL) {
        INFO(LOG_CUDA, "a CUDA driver is installed but has no cuPointerGetAttribute: buffers are "
                       "host");
        return;
    }
    cu_attr = attr;
    INFO(LOG_CUDA, "CUDA driver found: buffers are checked for device memory");
}

bool mem_have_cuda(void)
{
    pthread_once(&mem_once, mem_load);
    return cu_attr != NULL;
}

mem_type_t mem_type_of(const void *p)
{
    if (p == NULL || !mem_have_cuda()) return MEM_HOST;
    unsigned int type = 0, managed = 0;
    if (cu_attr(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (unsigned long long)(uintptr_t)p) != 0)
        return MEM_HOST;
    if (cu_attr(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, (unsigned long long)(uintptr_t)p) == 0 &&
        managed)
        return MEM_MANAGED;
    return type == CU_MEMORYTYPE_DEVICE ? MEM_DEVICE : MEM_HOST;
}
#endif
