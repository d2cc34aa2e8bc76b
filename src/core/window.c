/*
 * Registered windows, core's side (include/loom.h; the executor's side is src/cuda/dev_win.c):
 * the arguments checked, the communicator bound to the buffer's GPU and its device executor set
 * up (both collective, as the first device call is), then the window made by the executor. The
 * handle a caller holds is the executor's window; deregistration looks it up among the
 * communicator's windows before touching it, so a stale or foreign handle is refused safely.
 */
#include <stdint.h>

#include "coll.h"
#include "comm.h"
#include "memtype.h"

#include "dev.h"

static loomResult_t window_register(loomComm_t comm, void *buff, size_t size, loomWindow_t *win,
                                    int winFlags)
{
    const char *fn = "loomCommWindowRegister";
    if (winFlags & ~LOOM_WIN_COLL_SYMMETRIC)
        return base_error(loomInvalidArgument, LOG_CUDA,
                          "%s: rank %d: unknown flags 0x%x (LOOM_WIN_DEFAULT 0x0 or "
                          "LOOM_WIN_COLL_SYMMETRIC 0x1)",
                          fn, comm->rank, (unsigned)winFlags);
    if (buff == NULL || size == 0)
        return base_error(loomInvalidArgument, LOG_CUDA,
                          "%s: rank %d: buffer %p of %zu bytes (a window is a non-empty buffer)",
                          fn, comm->rank, buff, size);
#ifdef LOOM_HAVE_CUDA
    int ord = -1;
    mem_type_t mt = mem_type_dev(buff, &ord);
    if (mt != MEM_DEVICE)
        return base_error(
            loomInvalidArgument, LOG_CUDA,
            "%s: rank %d: %p is %s memory; a window is CUDA device memory (cudaMalloc, "
            "loomMemAlloc)",
            fn, comm->rank, buff, mt == MEM_MANAGED ? "CUDA managed" : "host");
    LOOM_CHECK(coll_dev_prepare(comm, buff, ord, fn));
    dev_host_t *h = &comm->dev.host;
    atomic_fetch_add(&comm->st.active_calls, 1);
    dev_win_t *w = NULL;
    loomResult_t r = dev_win_register(h, buff, size, winFlags, &w);
    atomic_fetch_sub(&comm->st.active_calls, 1);
    if (r == loomSuccess) *win = (loomWindow_t)(void *)w;
    return r;
#else
    (void)win;
    return base_error(loomInvalidUsage, LOG_CUDA,
                      "%s: rank %d: this loom was built without CUDA support (windows are device "
                      "memory)",
                      fn, comm->rank);
#endif
}

LOOM_EXPORT loomResult_t loomCommWindowRegister(loomComm_t comm, void *buff, size_t size,
                                                loomWindow_t *win, int winFlags)
{
    const char *fn = "loomCommWindowRegister";
    base_clear_error();
    if (win == NULL) return base_error(loomInvalidArgument, LOG_CUDA, "%s: win is NULL", fn);
    *win = NULL;
    LOOM_CHECK(comm_check(comm, fn));
    log_set_rank(comm->rank);
    bool held;
    LOOM_CHECK(comm_enter(comm, fn, 0, &held));
    loomResult_t r = window_register(comm, buff, size, win, winFlags);
    comm_leave(comm, held);
    return r;
}

static loomResult_t window_deregister(loomComm_t comm, loomWindow_t win);

LOOM_EXPORT loomResult_t loomCommWindowDeregister(loomComm_t comm, loomWindow_t win)
{
    const char *fn = "loomCommWindowDeregister";
    base_clear_error();
    if (comm == NULL) return base_error(loomInvalidArgument, LOG_CUDA, "%s: comm is NULL", fn);
    if (!comm_live(comm))
        return base_error(loomInvalidArgument, LOG_CUDA,
                          "%s: %p is not a live loom communicator (destroyed, or not one)", fn,
                          (void *)comm);
    bool held;
    LOOM_CHECK(comm_enter(comm, fn, 0, &held));
    loomResult_t r = window_deregister(comm, win);
    comm_leave(comm, held);
    return r;
}

static loomResult_t window_deregister(loomComm_t comm, loomWindow_t win)
{
    const char *fn = "loomCommWindowDeregister";
    if (win == NULL)
        return base_error(loomInvalidArgument, LOG_CUDA, "%s: rank %d: win is NULL", fn,
                          comm->rank);
#ifdef LOOM_HAVE_CUDA
    log_set_rank(comm->rank);
    /* a broken communicator still lets its windows go (locally): no comm_check here */
    atomic_fetch_add(&comm->st.active_calls, 1);
    loomResult_t r = dev_win_deregister(&comm->dev.host, (dev_win_t *)(void *)win);
    atomic_fetch_sub(&comm->st.active_calls, 1);
    return r;
#else
    return base_error(loomInvalidArgument, LOG_CUDA,
                      "%s: rank %d: %p is not a window of this communicator (this loom was built "
                      "without CUDA support)",
                      fn, comm->rank, (void *)win);
#endif
}
