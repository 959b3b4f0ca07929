/* device_cpu.c - the CPU's entry in the device table (nf_ktable.h):
 * a kernel arrives as a shared object, loaded and checked by the runtime's
 * verified loader (nf_kernel_load: ELF image, kernel ABI) on the thread
 * that offers it. */
#include "nf_ktable.h"
#include "nf_runtime.h"

static int cpu_accept(const nf__ktable *kt, int k, const void *bin, size_t len, void **obj,
                      nf_buf *err) {
  (void)kt;
  (void)k;
  nf_kernel *kn = NULL;
  int rc = nf_kernel_load(bin, len, &kn, err);
  *obj = kn;
  return rc;
}

static void cpu_drop(void *obj) { nf_kernel_free(obj); }

static int cpu_target(const nf__ktable *kt, const char **name) {
  (void)kt;
  if (name) *name = "";
  return 0;
}

const nf__device nf__cpu_device = {"cpu", cpu_accept, cpu_drop, cpu_target};
