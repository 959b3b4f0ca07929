/* nf_cuda_rt.h - the GPU runtime: the CUDA driver API loaded at run time
 * (dlopen of libcuda.so.1, or $NEOFLOW_LIBCUDA), never linked, so that
 * every binary starts on machines without a driver.
 *
 * One nf_cuda_rt is one device's primary context and its streams (one,
 * the libraries', unless nf_cuda_rt_set_streams adds more); kernel
 * images (cubin, or PTX that the driver compiles) are loaded with
 * cuModuleLoadData and run in the order of their launch plan
 * (nf_cuda_plan.h).  A sticky CUDA error (an illegal address, a launch
 * failure) leaves the context unusable: the runtime then refuses every
 * further call with the error that broke it; the owner closes it (a
 * measuring worker exits).
 *
 * Without a driver or a device, nf_cuda_rt_open says why (no
 * libcuda.so.1, the toolkit's stub library, no device, ...) and returns
 * NF_EUNSUPPORTED: the caller stays on the CPU.
 *
 * Thread safety: one nf_cuda_rt per thread at a time (the context is made
 * current on the calling thread by each call). */
#ifndef NF_CUDA_RT_H
#define NF_CUDA_RT_H

#include <stddef.h>
#include <stdint.h>

#include "nf_buf.h"
#include "nf_cuda_plan.h"

typedef struct nf_cuda_rt nf_cuda_rt;
typedef struct nf_cuda_module nf_cuda_module;

/* Opens device `device` (0: the first).  NF_OK; NF_EUNSUPPORTED with the
 * reason in why (no driver, stub library, no such device); NF_EIO for a
 * driver call that failed otherwise; NF_ENOMEM. */
int nf_cuda_rt_open(int device, nf_cuda_rt **out, nf_buf *why);
void nf_cuda_rt_close(nf_cuda_rt *rt);

/* The health probe: a tiny known kernel (PTX the driver compiles; CUDA C
 * with the emulated driver) loaded, run on one element and checked.
 * NF_OK, or the error (a sticky one leaves the runtime broken) or
 * NF_EIO for a wrong result, with the reason in err.  A measuring worker
 * runs it before its first candidate, a GPU session when it opens. */
int nf_cuda_rt_probe(nf_cuda_rt *rt, nf_buf *err);
/* The probe's PTX (for a test that assembles it with ptxas). */
const char *nf_cuda_rt_probe_ptx(void);
/* The device's compute capability as one number (9.0 -> 90) and name. */
int nf_cuda_rt_sm(const nf_cuda_rt *rt);
const char *nf_cuda_rt_name(const nf_cuda_rt *rt);
/* The runtime's stream (a CUstream), for libraries that queue work on it
 * (cuBLAS, nf_cublas.h). */
void *nf_cuda_rt_stream(const nf_cuda_rt *rt);
/* Makes the context current on the calling thread (before a library
 * call); NF_EIO when it broke earlier. */
int nf_cuda_rt_current(nf_cuda_rt *rt, nf_buf *err);

/* Device memory.  n == 0 allocates nothing and yields 0. */
int nf_cuda_rt_alloc(nf_cuda_rt *rt, size_t n, uint64_t *dptr, nf_buf *err);
void nf_cuda_rt_free(nf_cuda_rt *rt, uint64_t dptr);
int nf_cuda_rt_upload(nf_cuda_rt *rt, uint64_t dst, const void *src, size_t n, nf_buf *err);
int nf_cuda_rt_download(nf_cuda_rt *rt, void *dst, uint64_t src, size_t n, nf_buf *err);
/* Waits for everything queued on the runtime's streams. */
int nf_cuda_rt_sync(nf_cuda_rt *rt, nf_buf *err);
/* Without waiting: *idle 1 when every stream's queued work is done (a
 * driver without cuStreamQuery: after waiting for it).  NF_OK, or the
 * error the work ended with. */
int nf_cuda_rt_idle(nf_cuda_rt *rt, int *idle, nf_buf *err);

/* Several streams.  nf_cuda_rt_set_streams makes n in all (at most
 * NF_CUDA_MAX_STREAMS; stream 0 is the one libraries use);
 * nf_cuda_rt_select(i) sends later launches (nf_cuda_module_run, _time)
 * to stream i.  Ordering across streams is the caller's: events
 * (nf_cuda_rt_events makes n of them, numbered from 0) recorded on the
 * selected stream (nf_cuda_rt_record) and waited for by it
 * (nf_cuda_rt_wait; a never-recorded event is no wait).  With more than
 * one stream, an upload waits for every stream first and is complete when
 * it returns, and a download waits for every stream. */
#define NF_CUDA_MAX_STREAMS 8
int nf_cuda_rt_set_streams(nf_cuda_rt *rt, int n, nf_buf *err);
int nf_cuda_rt_n_streams(const nf_cuda_rt *rt);
void nf_cuda_rt_select(nf_cuda_rt *rt, int i);
/* The selected stream's number, and stream i (a CUstream) for libraries
 * that queue work on it (cuBLAS, cuDNN: a handle per stream). */
int nf_cuda_rt_selected(const nf_cuda_rt *rt);
void *nf_cuda_rt_stream_at(const nf_cuda_rt *rt, int i);
int nf_cuda_rt_events(nf_cuda_rt *rt, int n, nf_buf *err);
int nf_cuda_rt_record(nf_cuda_rt *rt, int ev, nf_buf *err);
int nf_cuda_rt_wait(nf_cuda_rt *rt, int ev, nf_buf *err);

/* CUDA graphs: what is queued on the streams between
 * nf_cuda_rt_capture_begin and _end (launches, library calls, event
 * records and waits, all from this thread) is recorded, not run, into a
 * graph that nf_cuda_rt_graph_launch replays on stream 0 in one call.
 * Begin forks every other stream from stream 0 (an event each), end
 * joins them back, so the graph holds the streams' work and its order.
 * Nothing may synchronise, copy or allocate in between.  _abort ends a
 * capture that failed midway (nothing captured runs).  nf_cuda_rt_graphs
 * says whether the driver has the entry points (11.4 or later). */
typedef struct nf_cuda_graph nf_cuda_graph;
/* 1 once a sticky error made the context unusable. */
int nf_cuda_rt_broken(const nf_cuda_rt *rt);
int nf_cuda_rt_graphs(const nf_cuda_rt *rt);
int nf_cuda_rt_capture_begin(nf_cuda_rt *rt, nf_buf *err);
int nf_cuda_rt_capture_end(nf_cuda_rt *rt, nf_cuda_graph **out, nf_buf *err);
void nf_cuda_rt_capture_abort(nf_cuda_rt *rt);
int nf_cuda_rt_graph_launch(nf_cuda_rt *rt, nf_cuda_graph *g, nf_buf *err);
void nf_cuda_graph_free(nf_cuda_rt *rt, nf_cuda_graph *g);

/* Loads an image and finds every launch's function (the plan is copied). */
int nf_cuda_module_load(nf_cuda_rt *rt, const void *image, size_t n, const nf_cuda_plan *plan,
                        nf_cuda_module **out, nf_buf *err);
/* Loads a kernel bundle (nf_cuda_plan.h): its image, or with the
 * emulated driver of the tests (tests/cuda_emu_driver.cc) its source. */
int nf_cuda_module_load_bundle(nf_cuda_rt *rt, const nf_cuda_bundle *b, nf_cuda_module **out,
                               nf_buf *err);
/* 1 when the driver loaded is the tests' CPU emulation. */
int nf_cuda_rt_emulated(const nf_cuda_rt *rt);
/* Queues the plan's launches on the selected stream with the n_args device
 * buffers args[] and a scratch buffer of at least plan.scratch_bytes. */
int nf_cuda_module_run(nf_cuda_module *m, const uint64_t *args, uint32_t n_args, uint64_t scratch,
                       nf_buf *err);
/* nf_cuda_module_run between two CUDA events on the stream, waiting for
 * the second: *ms is the device's time for the launches (the events'
 * resolution is about half a microsecond), without the host's launch
 * and synchronisation overhead.  Events are made once per runtime. */
int nf_cuda_module_time(nf_cuda_module *m, const uint64_t *args, uint32_t n_args, uint64_t scratch,
                        double *ms, nf_buf *err);
void nf_cuda_module_free(nf_cuda_module *m);

#endif
