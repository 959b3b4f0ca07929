/* loop.c - in progress (issue 4). */
typedef int nf__empty_loop;
