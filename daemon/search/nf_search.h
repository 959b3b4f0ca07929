/* nf_search.h - tuning one graph (a subgraph): evolutionary search over
 * the sketch space (nf_sketch.h) ranked by a cost model learned online
 * (nf_cost_model.h), with the best few candidates of every round compiled
 * and measured for real in a worker process (nf_measure.h).
 *
 * One run:
 *   1. check inputs are drawn from the seed and the reference interpreter
 *      (f64) computes the outputs every candidate must reproduce, with
 *      each element's rounding bound (nf_interp_run_bounded): only the
 *      error beyond it counts;
 *   2. the default (tier-1) schedule is measured first: default_ms;
 *   3. prior records (a resumed search, or the cache's) train the model
 *      and count as seen, and their best is the starting best; records
 *      of other subgraphs (corpus) train the model too, and a graph never
 *      tuned measures the best schedules of similar ones first
 *      (transfer, adapted by nf_search_adapt);
 *   4. rounds until a budget ends: a population (the best measured
 *      points, random samples) evolves for a few generations by mutation
 *      and crossover; every legal candidate (its schedule lowers) is
 *      scored by the model; the top `batch` unseen ones, plus an eps
 *      share drawn at random for exploration, are compiled and measured;
 *      the model is retrained on every record;
 *   5. budgets: max_trials measured candidates, max_seconds of wall time,
 *      and early stop after `patience` trials without a 1% gain;
 *   6. the default, the five best and a resumed run's prior best are
 *      measured once more, in turn (the
 *      best of many noisy medians flatters): best_ms and default_ms are
 *      those second measurements.
 * Failed candidates (crash, hang, wrong answer, compile error) are
 * records with their reason and never become the best.
 *
 * Reproducibility: the candidates drawn depend only on the seed and the
 * measured times, so a run with a deterministic measure_hook repeats
 * exactly; with real timings the sequence follows the measurements.
 *
 * GPU mode (cuda_sm > 0): candidates are the GPU knobs of every
 * statement (nf_gpu_knobs, nf_lower.h: block sizes, shared-memory tile
 * shapes, outputs per thread, virtual threads, reduction staging), drawn
 * at random or mutated one knob at a time from the best so far (half
 * each), kept when
 * they lower and their CUDA C is within the limits of threads and shared
 * memory, compiled by NVRTC into bundles and measured on the GPU by a
 * worker that owns the CUDA context (nf_measure.h).  Once the cost
 * model is trained (retrained every 8 trials), 4 trials in 5 measure the
 * best-scored of up to 16 fresh candidates (docs/search.md).  Budgets,
 * the default's first
 * measurement and the confirmation of the best are as above.
 * Not thread-safe per run; runs on different graphs may go concurrently. */
#ifndef NF_SEARCH_H
#define NF_SEARCH_H

#include <stddef.h>
#include <stdint.h>

#include "nf_buf.h"
#include "nf_codegen.h"
#include "nf_features.h"
#include "nf_ir.h"
#include "nf_lower.h"
#include "nf_measure.h"

/* The revision of the correctness check (what step 1 and the worker's
 * comparison accept).  neoflowd remembers a failure to tune ("no candidate
 * ran correctly") in the cache under it, and tunes such a key again once
 * the revision differs: bump it when the check changes what it accepts.
 * 1: errors judged beyond the reference's rounding bounds. */
#define NF_SEARCH_CHECK_REVISION 1

typedef struct nf_search_record {
  char *schedule;  /* canonical text (nf_schedule_print), malloc'd */
  float feat[NF_FEAT_N];
  int status;      /* nf_measure_status; NF_MEAS_LOAD also for a candidate
                      that did not compile */
  double time_ms;  /* median run time (NF_MEAS_OK), else 0 */
  double at_s;     /* seconds since the run started when it was measured */
  double confirmed_ms; /* the second measurement of the default and the
                          best few (0: not re-measured, or it failed) */
  int trial;       /* 1-based trial number (0: the default schedule, -1:
                      a prior record) */
  char reason[256];
} nf_search_record;

/* The features of a stored record (len bytes of little-endian f32, as the
 * cache keeps them) into out[NF_FEAT_N], for a run on a GPU (gpu 1) or a
 * CPU.  1 when usable: the current length, or for a CPU the length
 * before the GPU features (zero for every CPU program, padded here); 0
 * for another feature version (the record is then not a prior). */
int nf_search_record_feat(const void *data, size_t len, int gpu, float *out);

/* A record of another subgraph for the cost model: features, time (ms,
 * > 0) and its subgraph (group: labels are relative to the best time of
 * the record's own group). */
typedef struct nf_search_sample {
  float feat[NF_FEAT_N];
  double time_ms;
  uint32_t group;
} nf_search_sample;

typedef struct nf_search_progress {
  int trial, max_trials, failures;
  double best_ms, default_ms, last_ms; /* last_ms 0 when it failed */
  double elapsed_s;
} nf_search_progress;

typedef struct nf_search_opts {
  int max_trials;       /* measured candidates; 0: 200 */
  double max_seconds;   /* wall time; 0: no limit */
  int batch;            /* candidates measured per round; 0: 16 */
  int population;       /* evolved candidates per round; 0: 512 */
  int generations;      /* evolution steps per round; 0: 4 */
  double eps;           /* share of each batch drawn at random; < 0: 0, 0: 0.2 */
  int patience;         /* early stop after this many trials without a 1%
                           gain; 0: max(64, max_trials / 2); < 0: never */
  int random_search;    /* 1: no model, every candidate drawn at random
                           (the baseline the model is measured against) */
  int max_failures;     /* stop after this many consecutive failed
                           candidates (every candidate failing: give up,
                           keep the fallback); 0: 150; < 0: never */
  uint64_t seed;        /* 0 counts as 1 */
  nf_cpu_target target; /* code generation target (host when empty) */
  int cuda_sm;          /* > 0: tune for this GPU architecture instead (the
                           GPU mode below); measure.gpu is then implied */
  nf_measure_opts measure;
  /* resume: records of an earlier run on the same graph */
  const nf_search_record *prior;
  size_t n_prior;
  /* warm start of a graph never tuned (CPU mode): the best schedules of
   * similar subgraphs (nf_search_shape), nearest first.  Each is adapted
   * to g (nf_search_adapt) and measured as one of the first trials, after
   * the default; one that does not apply is dropped. */
  const char *const *transfer;
  size_t n_transfer;
  /* records of other subgraphs the cost model learns from too (from the
   * start: the first round is ranked by the model), each weighing
   * corpus_weight (0: 0.5) against 1 for this run's records, until this
   * run has 64 records of its own (then they only slow retraining down);
   * group numbers their subgraphs (this run is a group of its own) */
  const nf_search_sample *corpus;
  size_t n_corpus;
  double corpus_weight;
  /* called after every trial (may be NULL) */
  void (*progress)(void *user, const nf_search_progress *p);
  /* called with every record as it is made, the default's first (may be
   * NULL); rec is valid only during the call.  neoflowd's job process
   * streams records and improvements through it. */
  void (*on_record)(void *user, const nf_search_record *rec);
  void *user;
  /* tests: replaces compile + measure.  Fills rec->status, time_ms and
   * reason for the lowered candidate; returns NF_OK. */
  int (*measure_hook)(void *user, const nf_schedule *s, const nf_lprog *p,
                      nf_search_record *rec);
  /* tests (fault injection): may replace a compiled candidate's bytes
   * before it is measured; trial is its trial number (0: the default). */
  void (*candidate_hook)(void *user, int trial, nf_blob *so);
  /* tests: called for every candidate that passed the real check and was
   * timed (is_default: the default schedule); may replace rec->time_ms,
   * so that which correct candidate wins is made up while what is correct
   * is not (neoflowd's NF_JOB_FAKE_TIMES). */
  void (*time_hook)(void *user, int is_default, nf_search_record *rec);
} nf_search_opts;

typedef struct nf_search_result {
  nf_search_record *records; /* every trial in order, the default's first */
  size_t n_records;
  int trials;         /* measured candidates (the default not counted) */
  int failures;       /* of them, failed */
  double default_ms;  /* 0 when the default failed (re-measured, step 6) */
  double best_ms;     /* best correct time (the default's if nothing beat
                         it), re-measured (step 6) */
  char *best_schedule; /* its schedule's text */
  double flops;       /* floating-point operations of one run */
  double seconds;     /* wall time of the run */
  int transferred;    /* trials that measured a transferred schedule */
  int transfer_dropped; /* transferred schedules that did not apply to g */
  size_t corpus;      /* other subgraphs' records the cost model learnt from */
  int stopped_early;  /* patience ran out */
  int gave_up;        /* max_failures consecutive failures */
} nf_search_result;

/* Tunes g.  NF_OK with *res filled (free with nf_search_result_free), or
 * NF_EINVAL (a graph that cannot be run: f16 buffers, an output that is
 * an input), NF_EIO (no worker), NF_ENOMEM, with a message in err. */
int nf_search_run(const nf_graph *g, const nf_search_opts *o, nf_search_result *res,
                  nf_buf *err);
void nf_search_result_free(nf_search_result *r);

/* g's shape (nf_sk_shape, nf_sketch.h): its structural signature (16
 * bytes: the sketch class and loop structure, blind to extents, names and
 * scalar operators) and the descriptor of its extents (at most max floats,
 * *n_desc of them), by which the cache finds similar subgraphs.  NF_OK or
 * NF_ENOMEM. */
int nf_search_shape(const nf_graph *g, uint8_t sig[16], float *desc, size_t max, size_t *n_desc);
/* Another subgraph's schedule text adapted to g (transfer.c): packing of
 * tensors g's statement does not read by that name dropped, split factors
 * cut to the loops' extents, then checked by lowering.  NF_OK with *out
 * (nf_schedule_free), or the parse or lowering status with err. */
int nf_search_adapt(const nf_graph *g, const char *text, nf_schedule **out, nf_buf *err);
void nf_search_record_free(nf_search_record *r);

#endif
