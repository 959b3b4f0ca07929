/* nf_target.h - which machine this is: the host fingerprint that keys the
 * tuning cache and that a client and a daemon compare in their handshake.
 *
 * CPU: SHA-256 (libsodium) over
 *   "neoflow-target-v1 cpu\n" arch "\n" vendor "\n" model "\n"
 *   flags "\n" n_cpus
 * where arch is uname's machine, vendor and model come from the first
 * processor block of /proc/cpuinfo ("vendor_id", "model name"; where
 * those are absent, as on ARM, "CPU implementer 0x41" and "CPU part
 * 0xd0c"), flags are that block's "flags" (or "Features") sorted,
 * deduplicated and joined by single spaces, and n_cpus is the decimal
 * count of online logical CPUs.  A missing field is an empty string.
 * Two machines with the same CPU model and features share tuned kernels;
 * any difference (a feature, the core count that parallel kernels were
 * tuned for) is another key. */
#ifndef NF_TARGET_H
#define NF_TARGET_H

#include <stddef.h>
#include <stdint.h>

typedef struct nf_host_target {
  uint8_t fingerprint[32];
  char description[256]; /* "x86_64 AMD EPYC 9R14 96-Core Processor, 2 CPUs, avx512f
                            avx2 fma ...": the flags that matter to kernels,
                            those present, in a fixed order; truncated at a
                            word to fit */
} nf_host_target;

/* A GPU target: the fingerprint is SHA-256 over
 *   "neoflow-target-v1 cuda\n" "sm_" sm "\n" name
 * where name is the device's name as the driver reports it ("NVIDIA
 * H200"): one architecture with another SM count or memory is another
 * key.  The description is "cuda sm_<sm> <name>" (name truncated to
 * fit).  name NULL counts as "". */
void nf_cuda_target_make(int sm, const char *name, nf_host_target *t);

/* Fills *t for this machine (cached after the first call; thread-safe).
 * Never fails: missing /proc/cpuinfo yields a fingerprint of what uname
 * and sysconf say. */
void nf_host_target_get(nf_host_target *t);
/* The same from the text of a cpuinfo file (NULL: none), an architecture
 * name and a CPU count (tests); not cached. */
void nf__host_target_from(const char *cpuinfo, const char *arch, long n_cpus,
                          nf_host_target *t);

#endif
