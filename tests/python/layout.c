/* Prints the size and member offsets of every public struct the Python
 * binding mirrors, as JSON, for check_layout.py. */
#include <stddef.h>
#include <stdio.h>

#include <refit/refit.h>

#define M(T, f) printf("%s\"%s\": %zu", first ? "" : ", ", #f, offsetof(T, f)), first = 0
#define S(T, name, ...)                                                       \
    do {                                                                      \
        int first = 1;                                                        \
        printf("%s\"%s\": {\"size\": %zu, \"fields\": {", n++ ? ", " : "",    \
               name, sizeof(T));                                              \
        __VA_ARGS__;                                                          \
        printf("}}");                                                         \
    } while (0)

int main(void)
{
    int n = 0;
    printf("{");
    S(refit_tensor, "Tensor", M(refit_tensor, data); M(refit_tensor, device);
      M(refit_tensor, ndim); M(refit_tensor, dtype); M(refit_tensor, shape);
      M(refit_tensor, strides); M(refit_tensor, byte_offset));
    S(refit_options, "Options", M(refit_options, version); M(refit_options, worker_id);
      M(refit_options, rank); M(refit_options, journal_path); M(refit_options, plugin_dirs);
      M(refit_options, staging_budget); M(refit_options, journal_best_effort));
    S(refit_ckpt_spec, "CkptSpec", M(refit_ckpt_spec, version); M(refit_ckpt_spec, dtype);
      M(refit_ckpt_spec, ndim); M(refit_ckpt_spec, shape); M(refit_ckpt_spec, target);
      M(refit_ckpt_spec, shard_dim); M(refit_ckpt_spec, shard_rank);
      M(refit_ckpt_spec, shard_count); M(refit_ckpt_spec, pad_to); M(refit_ckpt_spec, expert);
      M(refit_ckpt_spec, dst_offset); M(refit_ckpt_spec, tie_of));
    S(refit_update_opts, "UpdateOpts", M(refit_update_opts, version);
      M(refit_update_opts, version_label); M(refit_update_opts, source_uri);
      M(refit_update_opts, rollback); M(refit_update_opts, source_digest);
      M(refit_update_opts, fingerprint));
    S(refit_replay_opts, "ReplayOpts", M(refit_replay_opts, version);
      M(refit_replay_opts, full); M(refit_replay_opts, rollback));
    S(refit_model_stats, "ModelStats", M(refit_model_stats, modules);
      M(refit_model_stats, routes_view); M(refit_model_stats, runtime_bytes));
    S(refit_txn_stats, "TxnStats", M(refit_txn_stats, tensors_loaded);
      M(refit_txn_stats, modules_complete));
    S(refit_source_tensor, "SourceTensor", M(refit_source_tensor, name);
      M(refit_source_tensor, shape); M(refit_source_tensor, bytes); M(refit_source_tensor, file));
    printf("}\n");
    return 0;
}
