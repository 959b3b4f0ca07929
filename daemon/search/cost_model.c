/* cost_model.c - the learned cost model (nf_cost_model.h): XGBoost
 * gradient-boosted regression trees over nf_features vectors.
 *
 * Records (a feature row, a measured time, a group and a weight)
 * accumulate in growing arrays.  Training labels every record with its
 * group's best time / time (0 for a failed record): a group is one
 * subgraph (0: the one being tuned, others: records of other subgraphs
 * from the cache), so every label says how a schedule ranks among its own
 * graph's, which is comparable across graphs where raw times are not.
 * It builds a fresh booster on all records (squared error,
 * depth-6 trees, eta 0.25, FEAT_ROUNDS rounds, histogram method) and
 * replaces the previous one only when every XGBoost call succeeded, so a
 * failed retraining keeps the last good model.  Missing values are NaN.
 *
 * Determinism: the histogram method with no row or column subsampling
 * and a fixed seed gives the same trees for the same records, and with
 * nthread 1 the same floating-point sums.
 *
 * Not thread-safe: one model is used by one thread at a time (XGBoost's
 * prediction buffer belongs to the booster).  XGBoost's own messages are
 * silenced (verbosity 0); its errors come back through
 * XGBGetLastError into the caller's err. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xgboost/c_api.h>

#include "nf_cost_model.h"

#define CM_ROUNDS 50

struct nf_cost_model {
  uint64_t seed;
  int n_threads;
  size_t n, cap;
  float *feat;  /* n rows of NF_FEAT_N */
  double *time; /* ms; <= 0: failed */
  uint32_t *group; /* whose best normalises the label (0: this run's) */
  float *weight;
  uint32_t n_groups; /* 1 + the largest group added */
  int weighted;      /* some weight is not 1 */
  BoosterHandle bst; /* NULL until trained */
};

nf_cost_model *nf_cost_model_new(uint64_t seed, int n_threads) {
  nf_cost_model *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->seed = seed;
  m->n_threads = n_threads > 0 ? n_threads : 1;
  return m;
}

void nf_cost_model_free(nf_cost_model *m) {
  if (!m) return;
  if (m->bst) XGBoosterFree(m->bst);
  free(m->feat);
  free(m->time);
  free(m->group);
  free(m->weight);
  free(m);
}

int nf_cost_model_add_sample(nf_cost_model *m, const float *feat, double time_ms,
                             uint32_t group, float weight) {
  if (!m || !feat || !(weight > 0) || group == UINT32_MAX) return NF_EINVAL;
  if (m->n == m->cap) {
    size_t cap = m->cap ? m->cap * 2 : 256;
    float *f = realloc(m->feat, cap * NF_FEAT_N * sizeof *f);
    if (!f) return NF_ENOMEM;
    m->feat = f;
    double *t = realloc(m->time, cap * sizeof *t);
    if (!t) return NF_ENOMEM;
    m->time = t;
    uint32_t *g = realloc(m->group, cap * sizeof *g);
    if (!g) return NF_ENOMEM;
    m->group = g;
    float *w = realloc(m->weight, cap * sizeof *w);
    if (!w) return NF_ENOMEM;
    m->weight = w;
    m->cap = cap;
  }
  memcpy(m->feat + m->n * NF_FEAT_N, feat, NF_FEAT_N * sizeof *feat);
  m->time[m->n] = isfinite(time_ms) && time_ms > 0 ? time_ms : 0;
  m->group[m->n] = group;
  m->weight[m->n] = weight;
  if (group >= m->n_groups) m->n_groups = group + 1;
  if (weight != 1.0f) m->weighted = 1;
  m->n++;
  return NF_OK;
}

int nf_cost_model_add(nf_cost_model *m, const float *feat, double time_ms) {
  return nf_cost_model_add_sample(m, feat, time_ms, 0, 1.0f);
}

size_t nf_cost_model_n_records(const nf_cost_model *m) { return m ? m->n : 0; }

void nf_cost_model_forget_others(nf_cost_model *m) {
  if (!m) return;
  size_t w = 0;
  for (size_t i = 0; i < m->n; i++) {
    if (m->group[i] != 0) continue;
    if (w != i) {
      memmove(m->feat + w * NF_FEAT_N, m->feat + i * NF_FEAT_N, NF_FEAT_N * sizeof *m->feat);
      m->time[w] = m->time[i];
      m->group[w] = 0;
      m->weight[w] = m->weight[i];
    }
    w++;
  }
  m->n = w;
  m->n_groups = w ? 1 : 0;
  m->weighted = 0;
  for (size_t i = 0; i < w; i++) m->weighted |= m->weight[i] != 1.0f;
}

int nf_cost_model_trained(const nf_cost_model *m) { return m && m->bst != NULL; }

/* Appends XGBoost's last error after what; returns NF_EINTERNAL. */
static int xgb_fail(nf_buf *err, const char *what) {
  if (err) nf_buf_printf(err, "xgboost: %s: %s", what, XGBGetLastError());
  return NF_EINTERNAL;
}

int nf_cost_model_train(nf_cost_model *m, nf_buf *err) {
  if (!m) return NF_EINVAL;
  /* each group's best time: its records' labels are relative to it */
  double *best = calloc(m->n_groups ? m->n_groups : 1, sizeof *best);
  if (!best) return NF_ENOMEM;
  int any = 0;
  for (size_t i = 0; i < m->n; i++) {
    double *b = &best[m->group[i]];
    if (m->time[i] > 0 && (*b == 0 || m->time[i] < *b)) *b = m->time[i];
    any |= m->time[i] > 0;
  }
  if (m->n < 2 || !any) {
    if (err)
      nf_buf_printf(err, "cost model: %zu records, %s successful: too few to train", m->n,
                    !any ? "none" : "some");
    free(best);
    return NF_EINVAL;
  }
  float *label = malloc(m->n * sizeof *label);
  if (!label) {
    free(best);
    return NF_ENOMEM;
  }
  for (size_t i = 0; i < m->n; i++)
    label[i] = m->time[i] > 0 ? (float)(best[m->group[i]] / m->time[i]) : 0.0f;
  free(best);

  DMatrixHandle dm = NULL;
  BoosterHandle b = NULL;
  int rc = NF_OK;
  char seed[32], nthread[16];
  snprintf(seed, sizeof seed, "%d", (int)(m->seed & 0x7fffffff));
  snprintf(nthread, sizeof nthread, "%d", m->n_threads);
  const char *params[][2] = {
      {"verbosity", "0"},          {"objective", "reg:squarederror"},
      {"booster", "gbtree"},       {"tree_method", "hist"},
      {"max_depth", "6"},          {"eta", "0.25"},
      {"min_child_weight", "1"},   {"lambda", "1"},
      {"seed", seed},              {"nthread", nthread},
  };
  if (XGDMatrixCreateFromMat(m->feat, (bst_ulong)m->n, NF_FEAT_N, NAN, &dm) != 0) {
    rc = xgb_fail(err, "creating the training matrix");
    goto done;
  }
  if (XGDMatrixSetFloatInfo(dm, "label", label, (bst_ulong)m->n) != 0) {
    rc = xgb_fail(err, "setting labels");
    goto done;
  }
  /* weights only where some differ from 1: the trees of a run without
   * other subgraphs' records stay exactly what they were */
  if (m->weighted && XGDMatrixSetFloatInfo(dm, "weight", m->weight, (bst_ulong)m->n) != 0) {
    rc = xgb_fail(err, "setting weights");
    goto done;
  }
  if (XGBoosterCreate(&dm, 1, &b) != 0) {
    rc = xgb_fail(err, "creating the booster");
    goto done;
  }
  for (size_t k = 0; k < sizeof params / sizeof params[0]; k++)
    if (XGBoosterSetParam(b, params[k][0], params[k][1]) != 0) {
      rc = xgb_fail(err, "setting a parameter");
      goto done;
    }
  for (int it = 0; it < CM_ROUNDS; it++)
    if (XGBoosterUpdateOneIter(b, it, dm) != 0) {
      rc = xgb_fail(err, "training");
      goto done;
    }
  if (m->bst) XGBoosterFree(m->bst);
  m->bst = b;
  b = NULL;
done:
  if (b) XGBoosterFree(b);
  if (dm) XGDMatrixFree(dm);
  free(label);
  return rc;
}

int nf_cost_model_predict(nf_cost_model *m, const float *feat, size_t n, float *score) {
  if (!m || (n > 0 && (!feat || !score))) return NF_EINVAL;
  if (n == 0) return NF_OK;
  if (!m->bst) {
    memset(score, 0, n * sizeof *score);
    return NF_OK;
  }
  DMatrixHandle dm = NULL;
  bst_ulong len = 0;
  const float *res = NULL;
  int rc = NF_OK;
  if (XGDMatrixCreateFromMat(feat, (bst_ulong)n, NF_FEAT_N, NAN, &dm) != 0)
    rc = NF_EINTERNAL;
  else if (XGBoosterPredict(m->bst, dm, 0, 0, 0, &len, &res) != 0 || len != n)
    rc = NF_EINTERNAL;
  else
    memcpy(score, res, n * sizeof *score);
  if (dm) XGDMatrixFree(dm);
  return rc;
}
