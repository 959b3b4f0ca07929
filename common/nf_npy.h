/* nf_npy.h - NumPy .npy files (format 1.0; 2.0 and 3.0 read too).
 *
 * Reads little- or big-endian f4, f8, i4, i8 (also i1/i2/u1/u2/u4 widened
 * to i64) and b1 arrays in C order; Fortran order and object arrays are
 * refused.  Writes little-endian C-order format 1.0.  Every malformed,
 * truncated or mistyped file is an error with a message naming the file
 * and the problem; nothing is read past the header's promise. */
#ifndef NF_NPY_H
#define NF_NPY_H

#include <stdint.h>

#include "nf_buf.h"
#include "nf_ir.h"

typedef struct nf_array {
  nf_dtype dtype; /* NF_BOOL, NF_I32, NF_I64, NF_F32 or NF_F64 */
  int rank;
  int64_t shape[NF_MAX_RANK];
  int64_t numel;
  void *data; /* malloc'ed, numel * nf_dtype_size(dtype) bytes, native */
} nf_array;

/* Allocates a zeroed array; NF_ENOMEM, NF_EOVERFLOW or NF_EINVAL. */
int nf_array_alloc(nf_array *a, nf_dtype t, int rank, const int64_t *shape);
void nf_array_free(nf_array *a);

/* Reads path into *a.  On error returns NF_EIO / NF_EFORMAT /
 * NF_EUNSUPPORTED and appends "path: why" to err. */
int nf_npy_read(const char *path, nf_array *a, nf_buf *err);
/* Parses an in-memory .npy image (for fuzzing and tests). */
int nf_npy_parse(const void *bytes, size_t n, const char *name, nf_array *a,
                 nf_buf *err);
/* Writes a (any supported dtype) to path atomically (temp file + rename). */
int nf_npy_write(const char *path, const nf_array *a, nf_buf *err);

#endif
