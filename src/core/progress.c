/*
 * The progress engine (see progress.h): the blocking wait of host calls, and the process's one
 * progress thread.
 *
 * Cost: progress_drive adds no thread hop and no allocation to a host call: it is the loop that
 * used to sit in the group runner, with the wait moved here. The thread exists only once
 * something attaches, and sleeps in ppoll when idle.
 *
 * Why poll and not epoll: the descriptors to wait on change from one wait to the next (links
 * connect lazily, groups start and end), a wait happens only after spinning found nothing, and
 * the sets are a handful of descriptors; gathering them afresh costs less than keeping an
 * epoll set in step with every transport, and ppoll also gives the thread sub-millisecond
 * sleeps for poll functions that watch GPU flags.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "base.h"
#include "fork.h"
#include "progress.h"

#define PROGRESS_MAX_FDS 256

/* A spin past its first PROGRESS_HOT_NS gives the core away on every pass (sched_yield returns
 * at once when nothing else wants it): on cores of its own a rank keeps polling without the
 * wake-up a sleep costs, while on cores it shares with ranks the library cannot count (other
 * jobs, network namespaces that each see every core) it does not take their time for the whole
 * LOOM_SPIN_US. */
static void spin_yield(uint64_t idle_ns, uint64_t hot_ns)
{
    if (idle_ns >= hot_ns) sched_yield();
}

/* Idle passes between two readings of the clock while spinning. A reading costs 20-40 ns
 * through the vDSO (a system call where the clock source has no vDSO path), about a pass over a
 * few connections: read at every pass and after every progress, the readings were a third of an
 * 8-byte call's samples on two ranks. Most waits of a step end within these passes, without a
 * reading; the spin's window starts at the first one (a few microseconds late at most). */
#define PROGRESS_CLOCK_EVERY 32

/* A spin's clock: since when nothing progressed (0: no reading since the last progress). */
typedef struct {
    uint64_t idle_since;
    unsigned quiet;
} idle_clock_t;

static void idle_reset(idle_clock_t *c)
{
    c->idle_since = 0;
    c->quiet = 0;
}

/* After a pass that moved nothing: true to pass again (spinning, with a yield past hot_ns),
 * false once spin_ns passed (time to block). */
static bool idle_spin(idle_clock_t *c, uint64_t spin_ns, uint64_t hot_ns)
{
    if (spin_ns > 0 && ++c->quiet < PROGRESS_CLOCK_EVERY) {
        if (hot_ns == 0) sched_yield();
        return true;
    }
    c->quiet = 0;
    uint64_t now = base_now_ns();
    if (c->idle_since == 0) c->idle_since = now;
    if (now - c->idle_since >= spin_ns) return false;
    spin_yield(now - c->idle_since, hot_ns);
    return true;
}

loomResult_t progress_drive(prog_work_t *w)
{
    idle_clock_t ic = {0, 0};
    for (;;) {
        bool done = false, progressed = false;
        LOOM_CHECK(w->advance(w, &done, &progressed));
        if (done) return loomSuccess;
        if (progressed) {
            idle_reset(&ic);
            continue;
        }
        if (idle_spin(&ic, w->spin_ns, w->hot_ns)) continue;
        LOOM_CHECK(w->check(w));
        struct pollfd fds[PROGRESS_MAX_FDS];
        int nf = w->pollfds(w, fds, PROGRESS_MAX_FDS);
        if (w->no_fds) {
            struct timespec ts = {0, (long)PROGRESS_POLL_NS};
            (void)ppoll(fds, (nfds_t)nf, &ts, NULL);
        } else {
            (void)poll(fds, (nfds_t)nf, PROGRESS_BLOCK_MS);
        }
    }
}

/* ---- the process's progress thread ---- */

typedef struct {
    progress_poll_fn fn;
    void *arg;
    uint64_t spin_ns, hot_ns;
} prog_source_t;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t idle; /* signalled when the source being polled changes */
    bool started;
    pthread_t thread;
    int wake_fd;
    prog_source_t *src;
    int nsrc, cap;
    void *busy; /* the arg whose poll function runs now, NULL between calls */
    prog_work_t **watch;
    int nwatch, wcap;
} pe = {.lock = PTHREAD_MUTEX_INITIALIZER, .idle = PTHREAD_COND_INITIALIZER, .wake_fd = -1};

static _Thread_local bool on_thread;

bool progress_on_thread(void)
{
    return on_thread;
}

static bool attached(void *arg)
{
    for (int k = 0; k < pe.nsrc; k++)
        if (pe.src[k].arg == arg) return true;
    return false;
}

/* Runs every attached poll function once; returns the shortest non-zero sleep asked for and
 * says whether any asked to be called again at once (*again). The list is copied first: a poll
 * function may attach or detach (itself or others) while it runs. */
static uint64_t poll_pass(bool *progressed, bool *again, uint64_t *spin, uint64_t *hot)
{
    static prog_source_t *snap;
    static int snap_cap;
    uint64_t sleep_ns = UINT64_MAX;
    *spin = 0;
    *hot = UINT64_MAX;
    *again = false;
    pthread_mutex_lock(&pe.lock);
    if (snap_cap < pe.nsrc) {
        prog_source_t *n = realloc(snap, (size_t)pe.cap * sizeof(*n));
        if (n == NULL) { /* try again on the next pass */
            pthread_mutex_unlock(&pe.lock);
            return 1000000;
        }
        snap = n;
        snap_cap = pe.cap;
    }
    int n = pe.nsrc;
    if (n > 0) memcpy(snap, pe.src, (size_t)n * sizeof(*snap)); /* snap is NULL until needed */
    for (int i = 0; i < n; i++) {
        if (!attached(snap[i].arg)) continue;
        pe.busy = snap[i].arg;
        pthread_mutex_unlock(&pe.lock);
        bool p = false;
        uint64_t hint = snap[i].fn(snap[i].arg, &p);
        pthread_mutex_lock(&pe.lock);
        pe.busy = NULL;
        pthread_cond_broadcast(&pe.idle);
        *progressed |= p;
        if (hint == 0)
            *again = true;
        else
            sleep_ns = LOOM_MIN(sleep_ns, hint);
        *spin = LOOM_MAX(*spin, snap[i].spin_ns);
        if (snap[i].spin_ns) *hot = LOOM_MIN(*hot, snap[i].hot_ns);
    }
    pthread_mutex_unlock(&pe.lock);
    return sleep_ns;
}

/* Sleeps until woken, until a watched descriptor fires, or for sleep_ns; `again`: a poll
 * function asked to be called at once (it waits for the network, whose descriptors are
 * watched, or for the GPU, which has none), so the sleep is capped. */
static void thread_sleep(uint64_t sleep_ns, bool again)
{
    struct pollfd fds[PROGRESS_MAX_FDS];
    int nf = 0;
    fds[nf++] = (struct pollfd){.fd = pe.wake_fd, .events = POLLIN};
    pthread_mutex_lock(&pe.lock);
    int nwatch = pe.nwatch;
    bool no_fds = false;
    for (int i = 0; i < pe.nwatch && nf < PROGRESS_MAX_FDS; i++) {
        nf += pe.watch[i]->pollfds(pe.watch[i], fds + nf, PROGRESS_MAX_FDS - nf);
        no_fds |= pe.watch[i]->no_fds;
    }
    pthread_mutex_unlock(&pe.lock);
    if (no_fds) sleep_ns = LOOM_MIN(sleep_ns, PROGRESS_POLL_NS);
    if (again) sleep_ns = LOOM_MIN(sleep_ns, nwatch ? PROGRESS_BLOCK_MS * 1000000ull : 50000ull);
    struct timespec ts, *tp = NULL;
    if (sleep_ns != UINT64_MAX) {
        ts.tv_sec = (time_t)(sleep_ns / 1000000000);
        ts.tv_nsec = (long)(sleep_ns % 1000000000);
        tp = &ts;
    }
    (void)ppoll(fds, (nfds_t)nf, tp, NULL);
    if (fds[0].revents & POLLIN) {
        uint64_t v;
        ssize_t n = read(pe.wake_fd, &v, sizeof(v));
        (void)n;
    }
}

static void *thread_main(void *arg)
{
    (void)arg;
    on_thread = true;
    idle_clock_t ic = {0, 0};
    for (;;) {
        bool progressed = false, again = false;
        uint64_t spin = 0, hot = 0;
        uint64_t sleep_ns = poll_pass(&progressed, &again, &spin, &hot);
        if (progressed) {
            idle_reset(&ic);
            continue;
        }
        if (again && idle_spin(&ic, spin, hot)) continue;
        thread_sleep(sleep_ns, again);
    }
    return NULL;
}

/* A forked child has no progress thread and none of its parent's attachments. */
void progress_atfork(base_fork_phase_t phase)
{
    if (phase == BASE_FORK_PREPARE) {
        pthread_mutex_lock(&pe.lock);
    } else if (phase == BASE_FORK_PARENT) {
        pthread_mutex_unlock(&pe.lock);
    } else {
        pthread_mutex_unlock(&pe.lock);
        pthread_cond_init(&pe.idle, NULL);
        pe.started = false;
        pe.nsrc = pe.nwatch = 0;
        pe.busy = NULL;
    }
}

static loomResult_t thread_start(void)
{
    core_fork_init();
    if (pe.wake_fd < 0) {
        pe.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (pe.wake_fd < 0)
            return base_error(loomSystemError, LOG_INIT, "progress thread: eventfd: %s",
                              strerror(errno));
    }
    /* The thread takes no signals meant for the application. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int e = pthread_create(&pe.thread, NULL, thread_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e != 0)
        return base_error(loomSystemError, LOG_INIT, "starting the progress thread: %s",
                          strerror(e));
    pthread_detach(pe.thread);
    pe.started = true;
    return loomSuccess;
}

loomResult_t progress_attach(progress_poll_fn fn, void *arg, uint64_t spin_ns, uint64_t hot_ns)
{
    loomResult_t r = loomSuccess;
    pthread_mutex_lock(&pe.lock);
    if (pe.nsrc == pe.cap) {
        int ncap = pe.cap ? 2 * pe.cap : 8;
        prog_source_t *n = realloc(pe.src, (size_t)ncap * sizeof(*n));
        if (n == NULL) {
            pthread_mutex_unlock(&pe.lock);
            return base_error(loomSystemError, LOG_INIT, "out of memory (progress thread)");
        }
        pe.src = n;
        pe.cap = ncap;
    }
    if (!pe.started) r = thread_start();
    if (r == loomSuccess) pe.src[pe.nsrc++] = (prog_source_t){fn, arg, spin_ns, hot_ns};
    pthread_mutex_unlock(&pe.lock);
    if (r == loomSuccess) progress_wake();
    return r;
}

void progress_detach(void *arg)
{
    pthread_mutex_lock(&pe.lock);
    for (int i = 0; i < pe.nsrc; i++)
        if (pe.src[i].arg == arg) {
            memmove(&pe.src[i], &pe.src[i + 1], (size_t)(pe.nsrc - i - 1) * sizeof(pe.src[0]));
            pe.nsrc--;
            break;
        }
    while (!on_thread && pe.busy == arg)
        pthread_cond_wait(&pe.idle, &pe.lock);
    pthread_mutex_unlock(&pe.lock);
}

void progress_wake(void)
{
    if (pe.wake_fd < 0) return;
    uint64_t one = 1;
    ssize_t n = write(pe.wake_fd, &one, sizeof(one));
    (void)n;
}

void progress_watch(prog_work_t *w)
{
    pthread_mutex_lock(&pe.lock);
    if (pe.nwatch == pe.wcap) {
        int ncap = pe.wcap ? 2 * pe.wcap : 8;
        prog_work_t **n = realloc(pe.watch, (size_t)ncap * sizeof(*n));
        if (n == NULL) { /* unwatched work is still advanced, only woken later */
            pthread_mutex_unlock(&pe.lock);
            return;
        }
        pe.watch = n;
        pe.wcap = ncap;
    }
    pe.watch[pe.nwatch++] = w;
    pthread_mutex_unlock(&pe.lock);
}

void progress_unwatch(prog_work_t *w)
{
    pthread_mutex_lock(&pe.lock);
    for (int i = 0; i < pe.nwatch; i++)
        if (pe.watch[i] == w) {
            pe.watch[i] = pe.watch[--pe.nwatch];
            break;
        }
    pthread_mutex_unlock(&pe.lock);
}
