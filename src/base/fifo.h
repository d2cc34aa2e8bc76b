/*
 * One first-in first-out list, intrusive: any struct with a `next` pointer to its own type is
 * an element, and a list is a head and a tail. Used for requests in posting order (tcp, shm:
 * the order is how messages match), pending descriptors, and staged device jobs. Nothing is
 * allocated; an element is in at most one list at a time.
 */
#ifndef LOOM_BASE_FIFO_H
#define LOOM_BASE_FIFO_H

#include <stddef.h>

/* A list of `type` (declare as FIFO(struct foo) name;). */
#define FIFO(type)                                                                                 \
    struct {                                                                                       \
        type *head, *tail;                                                                         \
    }

/* Appends element e to list q. */
#define FIFO_PUSH(q, e)                                                                            \
    do {                                                                                           \
        (e)->next = NULL;                                                                          \
        if ((q)->tail)                                                                             \
            (q)->tail->next = (e);                                                                 \
        else                                                                                       \
            (q)->head = (e);                                                                       \
        (q)->tail = (e);                                                                           \
    } while (0)

/* Removes the first element of q (which must not be empty). */
#define FIFO_DROP_HEAD(q)                                                                          \
    do {                                                                                           \
        (q)->head = (q)->head->next;                                                               \
        if ((q)->head == NULL) (q)->tail = NULL;                                                   \
    } while (0)

/* Puts e back at the front of q (an element just popped whose handling failed). */
#define FIFO_UNPOP(q, e)                                                                           \
    do {                                                                                           \
        (e)->next = (q)->head;                                                                     \
        (q)->head = (e);                                                                           \
        if ((q)->tail == NULL) (q)->tail = (e);                                                    \
    } while (0)

/* Removes and yields the first element of q, or NULL when it is empty. */
#define FIFO_POP(q)                                                                                \
    __extension__({                                                                                \
        __typeof__((q)->head) fifo_e_ = (q)->head;                                                 \
        if (fifo_e_) FIFO_DROP_HEAD(q);                                                            \
        fifo_e_;                                                                                   \
    })

#endif
