/*
 * The same-node GPU memory transport: GPU memory that the other processes (or threads) of a
 * node map into their own address space and access directly, over NVLink or PCIe.
 *
 * Memory comes from the VMM API (cuMemCreate) with a POSIX file-descriptor handle. A peer
 * imports it by taking the descriptor straight out of the owner's process (pidfd_getfd, the
 * permission process_vm_readv already needs), so no Unix socket is needed, and maps it with
 * read-write access for its own device. Each mapping holds its own reference to the physical
 * memory: if the owner dies, what the survivors mapped stays valid, and their kernels time out
 * on flags that stop moving instead of faulting.
 */
#ifndef LOOM_TRANSPORT_CUDA_TP_H
#define LOOM_TRANSPORT_CUDA_TP_H

#include <stddef.h>
#include <stdint.h>

#include "base.h"
#include "cudrv.h"

/* What a peer needs to map an exported allocation (sent through the bootstrap). */
typedef struct {
    int32_t pid;
    int32_t fd;  /* the owner's descriptor for the handle */
    int32_t dev; /* the owner's device ordinal (in its own numbering) */
    int32_t pad;
    uint64_t size;
} cuda_export_t;

typedef struct {
    CUdeviceptr ptr;
    size_t size;
    CUmemGenericAllocationHandle handle;
    int fd; /* exported descriptor (owner only), -1 otherwise */
    int mapped;
} cuda_mem_t;

/* Allocates `size` bytes (rounded up to the granularity) on device `dev`, mapped read-write for
 * it, and fills *exp for peers. The caller's context must be current. */
loomResult_t cuda_tp_alloc(const cudrv_t *d, int dev, size_t size, cuda_mem_t *out,
                           cuda_export_t *exp);
/* Maps a peer's allocation for device `dev`. */
loomResult_t cuda_tp_import(const cudrv_t *d, int dev, const cuda_export_t *exp, int peer_rank,
                            cuda_mem_t *out);
/* Unmaps and releases (owner or importer). */
void cuda_tp_release(const cudrv_t *d, cuda_mem_t *m);

#endif
