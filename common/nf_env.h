/* nf_env.h - every environment variable NeoFlow reads, in one table, and
 * the one function of its libraries that reads the environment (env.c).
 *
 * A library reads a variable where it needs it, through nf_env, never
 * through getenv: so the set of variables is closed and documented here
 * (docs/client.md and docs/daemon.md list them for users), and a test
 * (tests/layering.py) checks that no other file of libneoflow-client
 * reads the environment.  Each read is a fresh getenv (programs and tests
 * change variables between sessions); a session reads its variables when
 * it is created and keeps what they said in its options and state.
 *
 * Thread safety: as getenv (safe while nobody calls setenv). */
#ifndef NF_ENV_H
#define NF_ENV_H

/* X(ID, NAME, who reads it and what it says) */
#define NF_ENV_MAP(X)                                                                   \
  X(LIB, "NEOFLOW_LIB", "the .nf standard library's directory (module loader)")        \
  X(SOCKET, "NEOFLOW_SOCKET", "the daemon's address (clients, the tool, neoflowd)")    \
  X(CACHE, "NEOFLOW_CACHE", "the tuning cache's path (neoflowd, the cache tool)")      \
  X(CONFIG, "NEOFLOW_CONFIG", "the client's configuration file; none: no file")        \
  X(VERIFIED, "NEOFLOW_VERIFIED", "the client's record of verified kernels; none")     \
  X(DEVICE, "NEOFLOW_DEVICE", "a session's device when its options name none")         \
  X(THREADS, "NEOFLOW_THREADS", "a session's threads when its options give 0")         \
  X(GPU_STREAMS, "NEOFLOW_GPU_STREAMS", "streams of a GPU session (1-8)")              \
  X(GPU_GRAPHS, "NEOFLOW_GPU_GRAPHS", "0: no CUDA graphs in a GPU session")            \
  X(LIBCUDA, "NEOFLOW_LIBCUDA", "the CUDA driver library to load")                     \
  X(LIBNVRTC, "NEOFLOW_LIBNVRTC", "the NVRTC library a client loads")                  \
  X(LIBCUBLAS, "NEOFLOW_LIBCUBLAS", "the cuBLAS library to load")                      \
  X(LIBCUDNN, "NEOFLOW_LIBCUDNN", "the cuDNN library to load")                         \
  X(LIBNCCL, "NEOFLOW_LIBNCCL", "the NCCL library a data-parallel GPU session loads")    \
  X(DIST, "NEOFLOW_DIST", "off: a session under mpirun trains alone")                  \
  X(DIST_TIMEOUT, "NEOFLOW_DIST_TIMEOUT", "seconds an exchange of ranks may take")     \
  X(OMPI_SIZE, "OMPI_COMM_WORLD_SIZE", "Open MPI's launcher started the process")     \
  X(OMPI_LOCAL_RANK, "OMPI_COMM_WORLD_LOCAL_RANK", "the rank on its node: its GPU")       \
  X(MPI_LOCALRANKID, "MPI_LOCALRANKID", "the rank on its node (MPICH's Hydra): its GPU")   \
  X(SLURM_LOCALID, "SLURM_LOCALID", "the task on its node (Slurm's srun): its GPU")        \
  X(PMIX_RANK, "PMIX_RANK", "a PMIx launcher started the process")                     \
  X(PMI_SIZE, "PMI_SIZE", "a PMI launcher started the process")                        \
  X(NEOFLOWD, "NF_NEOFLOWD", "the neoflowd a client starts when none answers")         \
  X(WORKER, "NEOFLOW_WORKER", "the measurement worker the search starts")              \
  X(JOB_FAKE_TIMES, "NF_JOB_FAKE_TIMES", "tests: job processes report fixed times")    \
  X(JOB_FAULT, "NF_JOB_FAULT", "tests: a fault a job process injects")                 \
  X(LISTEN_PID, "LISTEN_PID", "systemd socket activation (neoflowd)")                  \
  X(LISTEN_FDS, "LISTEN_FDS", "systemd socket activation (neoflowd)")                  \
  X(PATH, "PATH", "where a client looks for neoflowd")                                 \
  X(HOME, "HOME", "default configuration and cache directories")                       \
  X(XDG_RUNTIME_DIR, "XDG_RUNTIME_DIR", "the per-user socket; unnamed kernel files")   \
  X(XDG_CONFIG_HOME, "XDG_CONFIG_HOME", "configuration files")                         \
  X(XDG_CACHE_HOME, "XDG_CACHE_HOME", "the daemon's cache, the client's records")

typedef enum nf_env_var {
#define NF__ENV_ENUM(id, name, doc) NF_ENV_##id,
  NF_ENV_MAP(NF__ENV_ENUM)
#undef NF__ENV_ENUM
  NF_ENV_COUNT
} nf_env_var;

/* The variable's value (getenv's pointer), NULL when unset. */
const char *nf_env(nf_env_var v);
/* Its name ("NEOFLOW_LIB"), for messages. */
const char *nf_env_name(nf_env_var v);

#endif
