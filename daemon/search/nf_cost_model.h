/* nf_cost_model.h - the learned cost model of the schedule search:
 * gradient-boosted trees (XGBoost C API) over nf_features vectors, trained
 * online on one subgraph's measured records.
 *
 * Labels are normalized throughputs: best time / time, in (0, 1] (a
 * failed candidate counts 0), the best of the record's own group (its
 * subgraph), so the model ranks candidates of one subgraph and may learn
 * from records of others; predictions are higher for faster candidates.  Training is
 * deterministic for a fixed seed (one XGBoost thread unless n_threads
 * says otherwise: training is cheap next to measuring). */
#ifndef NF_COST_MODEL_H
#define NF_COST_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "nf_buf.h"
#include "nf_features.h"

typedef struct nf_cost_model nf_cost_model;

/* NULL when out of memory. */
nf_cost_model *nf_cost_model_new(uint64_t seed, int n_threads);
void nf_cost_model_free(nf_cost_model *m);
/* Adds a record (copies NF_FEAT_N floats): features and the measured
 * median time in ms (<= 0 or not finite: a failed candidate).  NF_OK,
 * NF_ENOMEM, NF_EINVAL for a NULL argument.  A model is used by one thread
 * at a time. */
int nf_cost_model_add(nf_cost_model *m, const float *feat, double time_ms);
/* Adds a record of group `group` (its label is relative to the best time
 * of its group: records of different subgraphs are different groups; 0
 * is the one being tuned) weighing `weight` (> 0) in training.
 * nf_cost_model_add is group 0, weight 1.  NF_OK, NF_ENOMEM, NF_EINVAL. */
int nf_cost_model_add_sample(nf_cost_model *m, const float *feat, double time_ms,
                             uint32_t group, float weight);
size_t nf_cost_model_n_records(const nf_cost_model *m);
/* Drops every record not of group 0 (the next training is on this run's
 * records alone; the current trees stay until then). */
void nf_cost_model_forget_others(nf_cost_model *m);
/* (Re)trains on every record.  NF_OK, NF_EINVAL (fewer than 2 records or
 * no successful one), NF_EINTERNAL (XGBoost failed: message in err). */
int nf_cost_model_train(nf_cost_model *m, nf_buf *err);
int nf_cost_model_trained(const nf_cost_model *m);
/* Scores n feature vectors (n * NF_FEAT_N floats, row-major; NaN counts
 * as missing) into score[0..n); higher is faster.  Untrained: every score
 * 0.  NF_OK, NF_EINVAL for NULL arrays with n > 0, NF_EINTERNAL. */
int nf_cost_model_predict(nf_cost_model *m, const float *feat, size_t n, float *score);

#endif
