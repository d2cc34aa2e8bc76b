/*
 * Failures the host must turn into the communicator's error (see dev_impl.h): a kernel's failure
 * record, and the exit of a GPU peer's process on this node, which a watchdog sees through its
 * pidfd.
 */
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/eventfd.h>
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

static void *wd_main(void *arg)
{
    dev_state_t *s = arg;
    dev_host_t *h = s->h;
    log_set_rank(h->rank);
    struct pollfd fds[DEV_MAX_LOCAL + 1];
    while (!atomic_load(&s->wd.stop)) {
        int nf = 0, who[DEV_MAX_LOCAL + 1];
        fds[nf] = (struct pollfd){.fd = s->wd.wake_fd, .events = POLLIN};
        who[nf++] = -1;
        for (int j = 0; j < s->lay.n; j++)
            if (s->wd.pidfd[j] >= 0) {
                fds[nf] = (struct pollfd){.fd = s->wd.pidfd[j], .events = POLLIN};
                who[nf++] = j;
            }
        int k = poll(fds, (nfds_t)nf, 100);
        if (atomic_load(&s->wd.stop)) break;
        for (int i = 1; k > 0 && i < nf; i++) {
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
        }
        dev_poll(h);
    }
    return NULL;
}

loomResult_t dev_watch_start(dev_state_t *s)
{
    s->wd.wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->wd.wake_fd < 0 || pthread_create(&s->wd.thread, NULL, wd_main, s) != 0)
        return base_error(loomSystemError, LOG_CUDA, "starting the GPU watchdog thread failed");
    s->wd.live = true;
    return loomSuccess;
}
