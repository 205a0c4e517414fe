/* src/gateway/list.h - an intrusive doubly linked list (the kernel's and
 * libuv's queue), for the gateway's connections, requests and jobs.
 *
 * A list is a head idem_link_t; an element embeds an idem_link_t and is
 * found from it with IDEM_CONTAINER.  Nothing is allocated.  A removed
 * link points to itself, so removing it again is harmless.
 */
#ifndef IDEM_GATEWAY_LIST_H
#define IDEM_GATEWAY_LIST_H

#include <stdbool.h>
#include <stddef.h>

typedef struct idem_link {
    struct idem_link *prev, *next;
} idem_link_t;

static inline void idem_list_init(idem_link_t *head) { head->prev = head->next = head; }
static inline bool idem_list_empty(const idem_link_t *head) { return head->next == head; }
static inline void idem_list_push(idem_link_t *head, idem_link_t *l)
{
    l->prev = head->prev;
    l->next = head;
    head->prev->next = l;
    head->prev = l;
}
static inline void idem_list_remove(idem_link_t *l)
{
    l->prev->next = l->next;
    l->next->prev = l->prev;
    l->prev = l->next = l;
}
/** Move every element of from to the empty list to (from is left empty). */
static inline void idem_list_move(idem_link_t *to, idem_link_t *from)
{
    idem_list_init(to);
    if (idem_list_empty(from))
        return;
    to->next = from->next;
    to->prev = from->prev;
    to->next->prev = to;
    to->prev->next = to;
    idem_list_init(from);
}
#define IDEM_CONTAINER(ptr, type, member) ((type *)(void *)((char *)(ptr) - offsetof(type, member)))

#endif /* IDEM_GATEWAY_LIST_H */
