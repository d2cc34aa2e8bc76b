/*
 * The process's pthread_atfork handlers. prepare takes every process-wide lock in one fixed
 * order, outermost first (a lock that may be held while another is taken comes before it), so
 * that no other thread is inside any of them at the fork; the parent releases them in the
 * reverse order; the child, whose only thread is the one that forked and so holds them all,
 * releases them the same way (not a re-initialisation of a locked mutex, which POSIX leaves
 * undefined and ThreadSanitizer then reports as a double lock) and drops what belonged to its
 * parent's threads (the bootstrap root's sockets, the progress thread's attachments).
 */
#include <pthread.h>

#include "fork.h"

static void fork_prepare(void)
{
    launch_atfork(BASE_FORK_PREPARE);
    comm_atfork(BASE_FORK_PREPARE);
    progress_atfork(BASE_FORK_PREPARE);
    boot_atfork(BASE_FORK_PREPARE);
    param_atfork(BASE_FORK_PREPARE);
    base_error_atfork(BASE_FORK_PREPARE);
    log_atfork(BASE_FORK_PREPARE);
}

static void fork_parent(void)
{
    log_atfork(BASE_FORK_PARENT);
    base_error_atfork(BASE_FORK_PARENT);
    param_atfork(BASE_FORK_PARENT);
    boot_atfork(BASE_FORK_PARENT);
    progress_atfork(BASE_FORK_PARENT);
    comm_atfork(BASE_FORK_PARENT);
    launch_atfork(BASE_FORK_PARENT);
}

static void fork_child(void)
{
    log_atfork(BASE_FORK_CHILD);
    base_error_atfork(BASE_FORK_CHILD);
    param_atfork(BASE_FORK_CHILD);
    boot_atfork(BASE_FORK_CHILD);
    progress_atfork(BASE_FORK_CHILD);
    comm_atfork(BASE_FORK_CHILD);
    launch_atfork(BASE_FORK_CHILD);
}

static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void fork_register(void)
{
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

void core_fork_init(void)
{
    pthread_once(&fork_once, fork_register);
}
