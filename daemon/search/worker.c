/* worker.c - neoflow-worker: lands with the search issue (work in progress). */
#include <stdio.h>
int main(void) {
  fprintf(stderr, "neoflow-worker: not built yet\n");
  return 1;
}
