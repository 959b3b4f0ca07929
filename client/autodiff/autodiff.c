/* autodiff.c - in progress (issue 3). */
typedef int nf__empty_autodiff;
