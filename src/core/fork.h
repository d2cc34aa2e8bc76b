/*
 * Fork safety: one set of pthread_atfork handlers for every process-wide lock of loom, so that
 * a fork while another thread (the bootstrap root, the progress thread, the application's)
 * holds one cannot leave the child blocked on it forever.
 */
#ifndef LOOM_CORE_FORK_H
#define LOOM_CORE_FORK_H

#include "base.h"

/* Registers the handlers once; called by every entry that starts a thread or takes a lock. */
void core_fork_init(void);

/* Each room's part, called in the order fork.c fixes. */
void comm_atfork(base_fork_phase_t phase);
void launch_atfork(base_fork_phase_t phase);
void progress_atfork(base_fork_phase_t phase);
void boot_atfork(base_fork_phase_t phase);

/* How many sockets the root threads hold now (tests: a forked child must hold none). */
int boot_root_fd_count(void);

#endif
