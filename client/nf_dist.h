/* nf_dist.h - data-parallel sessions over MPI (dist.c; docs/distributed.md).
 *
 * A session opened in a program started by mpirun with more than one rank
 * trains one replica per rank: the parameters are broadcast from rank 0
 * when the session opens; each step averages the flat gradient vector
 * across the ranks before the fused optimizer update, in buckets of
 * parameters whose gradients are complete, each started (MPI_Iallreduce)
 * as soon as the op writing the last of them has run, while the rest of
 * the backward pass runs.  Every decision of the step loop that can change
 * numerics (which kernel an entry runs: a swap, a canary's verdict, a
 * race's winner) is taken alike on every rank (kt_run.c through the
 * agreement calls below), so that no step runs different kernels on
 * different ranks.  Evaluations exchange nothing (a rank may evaluate
 * alone): they run the kernels the steps agreed on.
 *
 * On GPUs (every rank on one, each its own: "cuda" is the rank's local
 * index on its node), the buckets are averaged on the device by NCCL
 * (nf_nccl.h; its communicator made from rank 0's identifier sent by
 * MPI), each queued after the ops that complete it, on their stream; the
 * step's end waits for the device without blocking, so that a hung peer
 * is named within the timeout too.  Agreements, heartbeats, the loss and
 * the parameters' broadcast go through MPI on the host.
 *
 * A rank that stops answering makes the others abort the job within
 * $NEOFLOW_DIST_TIMEOUT seconds (default 300) with a message naming it
 * (heartbeats each rank sends every other at each step's exchange).
 *
 * Without MPI in the build, or alone, every call is a no-op and s->dist
 * stays NULL. */
#ifndef NF_DIST_H
#define NF_DIST_H

#include <stdint.h>

struct nf_session;
typedef struct nf__dist nf__dist;

/* Joins the job when the program runs under an MPI launcher (or has
 * initialised MPI itself) with more than one rank ($NEOFLOW_DIST=off:
 * never): s->dist.  NF_EUNSUPPORTED when the ranks' devices differ in
 * kind or a GPU rank cannot load NCCL (on every rank); messages in
 * s->err. */
int nf__dist_open(struct nf_session *s);
/* After the step program is built and the parameters initialised: the
 * gradient buckets, and the parameters from rank 0. */
int nf__dist_start(struct nf_session *s);
void nf__dist_close(struct nf_session *s);
/* This rank and the job's size (0 and 1 alone). */
int nf__dist_rank(const struct nf_session *s);
int nf__dist_size(const struct nf_session *s);
/* The time this rank spent waiting for exchanges (the gradients', the
 * agreements'), in all, in ms. */
double nf__dist_wait_ms(const struct nf_session *s);

/* This rank cannot go on (an error the others would wait for): says so
 * with s->err, then aborts the job (MPI_Abort; mpirun stops every rank).
 * A no-op alone. */
void nf__dist_abort(struct nf_session *s, const char *why);
/* Rank 0's parameters to every rank (after rank 0 loaded a file). */
void nf__dist_bcast_params(struct nf_session *s);
/* A step begins (before its kernels are agreed on: heartbeats). */
void nf__dist_step_begin(struct nf_session *s);
/* The step loop (a step, never an evaluation): op i has run; before the
 * update: every gradient averaged.  Every exchange waits at most the
 * timeout. */
int nf__dist_op_done(struct nf_session *s, int i);
int nf__dist_grads(struct nf_session *s);
/* After a step's ops were queued (GPU: waits for the device, the means
 * with it, within the timeout; aborts the job naming the ranks not heard
 * from).  NF_OK. */
int nf__dist_step_end(struct nf_session *s);
/* A step's run of the ops begins (again, after a failed CUDA graph
 * capture): no bucket is queued yet. */
void nf__dist_run_begin(struct nf_session *s);
/* A GPU session's wait for its queued work (gpu_session.c: timed steps,
 * canaries, races): polled within the timeout, aborting the job naming
 * the ranks not heard from, when NCCL's work is among it.  NF_OK or the
 * runtime's error. */
int nf__dist_device_wait(struct nf_session *s);

/* Agreement: v[0..n) replaced by its mean over the ranks; 1 when ok on
 * every rank; v[i] kept where it is the same on every rank, else 0. */
void nf__dist_mean(struct nf_session *s, double *v, int n);
int nf__dist_all(struct nf_session *s, int ok);
void nf__dist_same(struct nf_session *s, uint64_t *v, int n);

#endif
