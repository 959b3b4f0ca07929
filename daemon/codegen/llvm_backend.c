/* llvm_backend.c - in progress (issue 4). */
typedef int nf__empty_llvm_backend;
