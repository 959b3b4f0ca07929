/* loader.c - verified loading of kernel shared objects from memory.
 *
 * bytes -> memfd (sealed) -> ELF checks on the sealed contents ->
 * dlopen("/proc/self/fd/N", RTLD_NOW | RTLD_LOCAL) -> dlsym; fallback to
 * an unnamed O_TMPFILE file in a fresh private directory when executing a
 * memfd is refused.  See nf_runtime.h for the unloading policy.
 *
 * ELF checks (before anything is mapped): 64-bit little-endian, ET_DYN,
 * the host machine, header and program headers inside the file, every
 * PT_LOAD inside the file, no PT_TLS and no PT_INTERP, and a dynamic
 * section without DT_INIT/DT_FINI/init or fini arrays (generated code has
 * no constructors or destructors; an object that has them is not ours).
 *
 * dlopen identifies objects by path first, and "/proc/self/fd/N" names
 * repeat once N is reused while an earlier kernel stays resident, so each
 * load spells a unique path to the same descriptor (open_fd). */
#include <dlfcn.h>
#include <pthread.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nf_env.h"
#include "nf_runtime.h"

#if defined(__x86_64__)
#define HOST_MACHINE EM_X86_64
#elif defined(__aarch64__)
#define HOST_MACHINE EM_AARCH64
#else
#define HOST_MACHINE EM_NONE
#endif

struct nf_kernel {
  void *handle;
  nf_kernel_fn fn;
  int fallback;
};

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;

static int elf_check(const uint8_t *b, size_t n, nf_buf *err) {
  Elf64_Ehdr eh;
  if (n < sizeof eh) {
    nf_buf_printf(err, "kernel: %zu bytes is too short for an ELF header", n);
    return NF_EFORMAT;
  }
  memcpy(&eh, b, sizeof eh);
  if (memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) {
    nf_buf_puts(err, "kernel: not an ELF file (bad magic)");
    return NF_EFORMAT;
  }
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_DATA] != ELFDATA2LSB) {
    nf_buf_puts(err, "kernel: not a 64-bit little-endian ELF file");
    return NF_EFORMAT;
  }
  if (eh.e_type != ET_DYN) {
    nf_buf_printf(err, "kernel: ELF type %u is not a shared object (ET_DYN)", eh.e_type);
    return NF_EFORMAT;
  }
  if (eh.e_machine != HOST_MACHINE) {
    nf_buf_printf(err, "kernel: ELF machine %u is not this host's (%u)", eh.e_machine,
                  (unsigned)HOST_MACHINE);
    return NF_EFORMAT;
  }
  if (eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum == 0 || eh.e_phoff > n ||
      (n - eh.e_phoff) / sizeof(Elf64_Phdr) < eh.e_phnum) {
    nf_buf_puts(err, "kernel: program headers missing or outside the file (truncated?)");
    return NF_EFORMAT;
  }
  if (eh.e_shnum && (eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shoff > n ||
                     (n - eh.e_shoff) / sizeof(Elf64_Shdr) < eh.e_shnum)) {
    nf_buf_puts(err, "kernel: section headers outside the file (truncated?)");
    return NF_EFORMAT;
  }
  int n_load = 0;
  for (unsigned i = 0; i < eh.e_phnum; i++) {
    Elf64_Phdr ph;
    memcpy(&ph, b + eh.e_phoff + (size_t)i * sizeof ph, sizeof ph);
    if (ph.p_type == PT_TLS || ph.p_type == PT_INTERP) {
      nf_buf_printf(err, "kernel: unexpected %s segment", ph.p_type == PT_TLS ? "TLS" : "INTERP");
      return NF_EFORMAT;
    }
    if (ph.p_type == PT_LOAD || ph.p_type == PT_DYNAMIC) {
      if (ph.p_offset > n || n - ph.p_offset < ph.p_filesz) {
        nf_buf_puts(err, "kernel: a segment lies outside the file (truncated?)");
        return NF_EFORMAT;
      }
      n_load += ph.p_type == PT_LOAD;
    }
    if (ph.p_type == PT_DYNAMIC) {
      for (size_t o = 0; o + sizeof(Elf64_Dyn) <= ph.p_filesz; o += sizeof(Elf64_Dyn)) {
        Elf64_Dyn d;
        memcpy(&d, b + ph.p_offset + o, sizeof d);
        if (d.d_tag == DT_NULL) break;
        if (d.d_tag == DT_INIT || d.d_tag == DT_FINI || d.d_tag == DT_PREINIT_ARRAY ||
            ((d.d_tag == DT_INIT_ARRAYSZ || d.d_tag == DT_FINI_ARRAYSZ) && d.d_un.d_val)) {
          nf_buf_puts(err, "kernel: the object has constructors or destructors");
          return NF_EFORMAT;
        }
      }
    }
  }
  if (!n_load) {
    nf_buf_puts(err, "kernel: no loadable segment");
    return NF_EFORMAT;
  }
  return NF_OK;
}

static int write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Re-reads fd and checks what will actually be mapped. */
static int check_fd(int fd, size_t n, nf_buf *err) {
  uint8_t *b = malloc(n ? n : 1);
  if (!b) return NF_ENOMEM;
  size_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, b + got, n - got, (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  int rc = got == n ? elf_check(b, n, err) : NF_EIO;
  if (got != n) nf_buf_puts(err, "kernel: cannot read back the sealed copy");
  free(b);
  return rc;
}

/* dlopen through /proc/self/fd/N under a name the dynamic loader has never
 * seen (see the file comment): a process-wide counter is spelled into the
 * path as empty ("/") and current-directory ("/.") components, so every
 * load gets its own string however many kernels stay resident and however
 * descriptor numbers repeat.  Takes ownership of nothing. */
static void *open_fd(int fd, nf_buf *err) {
  static atomic_ulong counter;
  unsigned long c = atomic_fetch_add(&counter, 1);
  char path[160];
  size_t n = (size_t)snprintf(path, sizeof path, "/proc/self/fd");
  for (int b = 0; b < 40; b++) {
    if (c >> b & 1) n += (size_t)snprintf(path + n, sizeof path - n, "/.");
    else n += (size_t)snprintf(path + n, sizeof path - n, "/");
    if (!(c >> b >> 1)) break;
  }
  snprintf(path + n, sizeof path - n, "/%d", fd);
  dlerror();
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *m = dlerror();
    nf_buf_printf(err, "kernel: dlopen: %s", m ? m : "failed");
  }
  return h;
}

static int memfd_path(const void *so, size_t n, void **h, nf_buf *err) {
  unsigned fl = MFD_CLOEXEC | MFD_ALLOW_SEALING;
  int fd = -1;
#ifdef MFD_EXEC
  fd = memfd_create("nf-kernel", fl | MFD_EXEC);
  if (fd < 0 && errno != EINVAL) {
    nf_buf_printf(err, "kernel: memfd_create: %s", strerror(errno));
    return NF_EIO;
  }
#endif
  if (fd < 0) fd = memfd_create("nf-kernel", fl);
  if (fd < 0) {
    nf_buf_printf(err, "kernel: memfd_create: %s", strerror(errno));
    return NF_EIO;
  }
  int rc = NF_EIO;
  if (write_all(fd, so, n) != 0) {
    nf_buf_printf(err, "kernel: writing the memfd: %s", strerror(errno));
    goto out;
  }
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    nf_buf_printf(err, "kernel: sealing the memfd: %s", strerror(errno));
    goto out;
  }
  rc = check_fd(fd, n, err);
  if (rc) goto out;
  *h = open_fd(fd, err);
  rc = *h ? NF_OK : NF_EIO;
out:
  close(fd);
  return rc;
}

static int tmpfile_path(const void *so, size_t n, void **h, nf_buf *err) {
  const char *base = nf_env(NF_ENV_XDG_RUNTIME_DIR);
  char dir[512];
  if (!base || !*base || strlen(base) > 400) base = "/tmp";
  snprintf(dir, sizeof dir, "%s/nf-kernel-XXXXXX", base);
  if (!mkdtemp(dir)) {
    nf_buf_printf(err, "kernel: mkdtemp in %s: %s", base, strerror(errno));
    return NF_EIO;
  }
  int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0700);
  int e = errno;
  rmdir(dir);
  if (fd < 0) {
    nf_buf_printf(err, "kernel: O_TMPFILE in %s: %s", base, strerror(e));
    return NF_EIO;
  }
  int rc = NF_EIO;
  if (write_all(fd, so, n) != 0) {
    nf_buf_printf(err, "kernel: writing the temporary file: %s", strerror(errno));
    goto out;
  }
  rc = check_fd(fd, n, err);
  if (rc) goto out;
  *h = open_fd(fd, err);
  rc = *h ? NF_OK : NF_EIO;
out:
  close(fd);
  return rc;
}

int nf_kernel_load_ex(const void *so, size_t n, unsigned flags, nf_kernel **out,
                      nf_buf *err) {
  *out = NULL;
  if (!so) n = 0;
  int rc = elf_check(so, n, err);
  if (rc) return rc;
  nf_kernel *k = calloc(1, sizeof *k);
  if (!k) return NF_ENOMEM;
  void *h = NULL;
  pthread_mutex_lock(&load_lock);
  if (!(flags & NF_LOAD_FORCE_TMPFILE)) rc = memfd_path(so, n, &h, err);
  if ((flags & NF_LOAD_FORCE_TMPFILE) || rc == NF_EIO) {
    if (rc == NF_EIO) nf_buf_puts(err, "; trying O_TMPFILE: ");
    rc = tmpfile_path(so, n, &h, err);
    k->fallback = 1;
  }
  pthread_mutex_unlock(&load_lock);
  if (rc) {
    free(k);
    return rc;
  }
  dlerror();
  void *sym = dlsym(h, NF_KERNEL_SYMBOL);
  if (!sym) {
    nf_buf_puts(err, "kernel: the object does not export " NF_KERNEL_SYMBOL);
    dlclose(h); /* never called: safe */
    free(k);
    return NF_EFORMAT;
  }
  k->handle = h;
  memcpy(&k->fn, &sym, sizeof sym);
  *out = k;
  return NF_OK;
}

int nf_kernel_load(const void *so, size_t n, nf_kernel **out, nf_buf *err) {
  return nf_kernel_load_ex(so, n, 0, out, err);
}

nf_kernel_fn nf_kernel_entry(const nf_kernel *k) { return k ? k->fn : NULL; }

int nf_kernel_used_fallback(const nf_kernel *k) { return k ? k->fallback : 0; }

int nf_kernel_run(const nf_kernel *k, void *const *buffers, uint32_t n, nf_pool *pool,
                  nf_buf *err) {
  nf_kernel_args a;
  a.abi_version = NF_KERNEL_ABI_VERSION;
  a.n_buffers = n;
  a.buffers = buffers;
  a.parallel_for = pool ? nf_pool_parallel_for : NULL;
  a.runtime = pool;
  int r = k->fn(&a);
  if (r != 0) {
    if (err) nf_buf_printf(err, "kernel returned %d", r);
    return NF_EINVAL;
  }
  return NF_OK;
}

void nf_kernel_free(nf_kernel *k) { free(k); }

void nf_kernel_free_unload(nf_kernel *k) {
  if (!k) return;
  if (k->handle) dlclose(k->handle);
  free(k);
}
