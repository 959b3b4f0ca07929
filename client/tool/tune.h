/* tune.h - `neoflow tune`: runs the schedule search (daemon/search) on an
 * instantiated graph in-process and reports it: a progress bar on a
 * terminal, the best-so-far curve, CSV and SVG of the curve, the best
 * schedule, and one JSON object with --json.  (neoflow.c parses the
 * command line and builds the graph; this file does the rest.) */
#ifndef NF_TUNE_H
#define NF_TUNE_H

#include <stdint.h>

#include "nf_codegen.h"
#include "nf_ir.h"

typedef struct nf_tune_cli {
  const char *def;      /* for reports */
  int trials;           /* --trials N (0: 200) */
  double seconds;       /* --seconds S (0: no limit) */
  int threads;          /* --threads T */
  int json;             /* --json */
  int random_search;    /* --random: no cost model */
  int compare_random;   /* --compare-random: also run random search, plot both */
  uint64_t seed;        /* --seed */
  const char *csv;      /* --csv FILE */
  const char *svg;      /* --svg FILE */
  const char *out;      /* -o FILE: the best schedule */
  nf_cpu_target target; /* --target (empty: the host) */
  int cuda_sm;          /* --target cuda:sm_XX: tune on the GPU (docs/gpu.md) */
} nf_tune_cli;

/* Returns the tool's exit status (0, or 1 with a message on stderr). */
int nf_tune_main(const nf_graph *g, const nf_tune_cli *t);

#endif
