/*
 * Failures the host must turn into the communicator's error (see dev_impl.h): a kernel's failure
 * record, and the exit of a GPU peer's process on this node, which a watchdog sees through its
 * pidfd, both polled from core's progress thread.
 */
#include <poll.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <unistd.h>

#include "dev_impl.h"

/* ---- errors ---- */

/* The kernel's failure record as the communicator's error. */
void dev_poll(dev_host_t *h)
{
    dev_state_t *s = h->state;
    if (s == NULL || s->xg.err == NULL || s->xg.err->code == DEV_ERR_NONE) return;
    if (h->error(h, NULL) != loomSuccess) return;
    __sync_synchronize();
    dev_err_t e = *(dev_err_t *)s->xg.err;
    int peer = e.peer >= 0 && e.peer < s->lay.n ? s->lay.lrank[e.peer] : -1;
    char text[DEV_TEXT_MAX];
    if (e.code == DEV_ERR_TIMEOUT)
        snprintf(text, sizeof(text),
                 "rank %d: the GPU kernel of %s (device operation %llu) waited %.1f s for rank "
                 "%d (block %d, %s step %llu, saw %llu) and gave up (LOOM_TIMEOUT=%g s): that "
                 "rank died, stalled, or did not make the same call",
                 h->rank, dev_kind_name(s->run.opkind[e.seq % 64]), e.seq, e.waited_ns / 1e9, peer,
                 e.block, e.wait_kind == DEV_WAIT_ACK ? "acknowledgement of" : "data of", e.step,
                 e.seen, h->timeout_s);
    else
        snprintf(text, sizeof(text),
                 "rank %d: the GPU kernel of %s (device operation %llu) stopped while waiting for "
                 "rank %d: the communicator was aborted",
                 h->rank, dev_kind_name(s->run.opkind[e.seq % 64]), e.seq, peer);
    WARN(LOG_CUDA, "%s", text);
    h->set_error(h, e.code == DEV_ERR_TIMEOUT ? loomRemoteError : loomInvalidUsage, text);
}

/* As often as the watchdog thread's poll timeout woke it before it ran here. */
#define WATCH_PERIOD_NS 100000000ull

/* The watchdog's poll function on core's progress thread: every WATCH_PERIOD_NS, without
 * waiting, the pidfds of the node's GPU peers (an exit raises the abort word and becomes the
 * communicator's error) and the kernels' failure record. */
static uint64_t watch_poll(void *arg, bool *progressed)
{
    dev_state_t *s = (dev_state_t *)((char *)arg - offsetof(dev_state_t, wd));
    dev_host_t *h = s->h;
    if (atomic_load(&s->wd.stop)) return UINT64_MAX;
    uint64_t now = base_now_ns();
    if (now < s->wd.next_ns) return s->wd.next_ns - now;
    s->wd.next_ns = now + WATCH_PERIOD_NS;
    struct pollfd fds[DEV_MAX_LOCAL];
    int nf = 0, who[DEV_MAX_LOCAL];
    for (int j = 0; j < s->lay.n; j++)
        if (s->wd.pidfd[j] >= 0) {
            fds[nf] = (struct pollfd){.fd = s->wd.pidfd[j], .events = POLLIN};
            who[nf++] = j;
        }
    int k = nf > 0 ? poll(fds, (nfds_t)nf, 0) : 0;
    for (int i = 0; k > 0 && i < nf; i++) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        int j = who[i];
        close(s->wd.pidfd[j]);
        s->wd.pidfd[j] = -1;
        char text[DEV_TEXT_MAX];
        snprintf(text, sizeof(text),
                 "rank %d: rank %d (pid %d, GPU peer on this node) exited; its GPU memory "
                 "flags will never move again, so device collectives on this communicator "
                 "stop with this error (kernels in flight were told to give up)",
                 h->rank, s->lay.lrank[j], s->wd.pid[j]);
        s->xg.err->abort = 1;
        WARN(LOG_CUDA, "%s", text);
        h->set_error(h, loomRemoteError, text);
        *progressed = true;
    }
    dev_calls_check(s);
    dev_poll(h);
    return WATCH_PERIOD_NS;
}

loomResult_t dev_watch_start(dev_state_t *s)
{
    dev_host_t *h = s->h;
    if (h->progress_attach == NULL)
        return base_error(loomInternalError, LOG_CUDA,
                          "rank %d: core offers the device executor no progress thread", h->rank);
    LOOM_CHECK(h->progress_attach(h, watch_poll, &s->wd));
    s->wd.attached = true;
    return loomSuccess;
}

/* Teardown, after stop: the watchdog off the progress thread (its pidfds stay for dev_free). */
void dev_watch_detach(dev_state_t *s)
{
    if (!s->wd.attached) return;
    s->h->progress_detach(s->h, &s->wd);
    s->wd.attached = false;
}
