/* nf_gpugen.h - the GPU generator (gpu_local.c): a producer of tier-0
 * kernels for a GPU session's kernel table.  It sees the table, never the
 * session. */
#ifndef NF_GPUGEN_H
#define NF_GPUGEN_H

#include <stddef.h>
#include <stdint.h>

#include "nf_ktable.h"

struct nf__gen;

/* Tier-0 kernels a GPU session generates itself for the
 * entries no library takes (lib[k] == 0), compiled for sm by an NVRTC
 * loaded at run time and handed over as tier 0.  note gets where those
 * entries run meanwhile, for the session's opening line.  NF_OK also
 * when there is no NVRTC (the note says so); NF_ENOMEM. */
int nf__gpu_gen_start(nf__ktable *kt, const uint8_t *lib, int sm, char *note, size_t note_n,
                      struct nf__gen **out);
/* Stops the thread (at its next entry) and frees it; no-op without one. */
void nf__gpu_gen_stop(struct nf__gen *gen);
/* Waits until the thread has gone through every entry; how many kernels
 * it handed over, how many subgraphs the backend refused, how many
 * failed, and the time spent compiling.  NF_EUNSUPPORTED: no thread. */
int nf__gpu_gen_wait(struct nf__gen *gen, int *made, int *refused, int *failed, double *ms);

#endif
