/* npy.c - placeholder until its module lands in this work. */
typedef int nf__empty_tu_npy;
