/* Prints the size and member offsets of every public struct the Python
 * binding mirrors, as JSON, for check_layout.py. */
#include <stddef.h>
#include <stdio.h>

#include <refit/refit.h>
#include <refit/ipc.h>
#include <refit/sys/cuda.h>
#include <refit/transport.h>

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
      M(refit_options, staging_budget); M(refit_options, journal_best_effort);
      M(refit_options, undo_device_budget); M(refit_options, log_fn); M(refit_options, log_user));
    S(refit_ckpt_spec, "CkptSpec", M(refit_ckpt_spec, version); M(refit_ckpt_spec, dtype);
      M(refit_ckpt_spec, ndim); M(refit_ckpt_spec, shape); M(refit_ckpt_spec, target);
      M(refit_ckpt_spec, shard_dim); M(refit_ckpt_spec, shard_rank);
      M(refit_ckpt_spec, shard_count); M(refit_ckpt_spec, pad_to); M(refit_ckpt_spec, expert);
      M(refit_ckpt_spec, dst_offset); M(refit_ckpt_spec, tie_of));
    S(refit_update_opts, "UpdateOpts", M(refit_update_opts, version);
      M(refit_update_opts, version_label); M(refit_update_opts, source_uri);
      M(refit_update_opts, rollback); M(refit_update_opts, source_digest);
      M(refit_update_opts, fingerprint); M(refit_update_opts, partial);
      M(refit_update_opts, keep_going));
    S(refit_seal_opts, "SealOpts", M(refit_seal_opts, version);
      M(refit_seal_opts, undo_reserve));
    S(refit_replay_opts, "ReplayOpts", M(refit_replay_opts, version);
      M(refit_replay_opts, full); M(refit_replay_opts, rollback));
    S(refit_restore_opts, "RestoreOpts", M(refit_restore_opts, version);
      M(refit_restore_opts, rollback));
    S(refit_model_stats, "ModelStats", M(refit_model_stats, modules);
      M(refit_model_stats, routes_view); M(refit_model_stats, runtime_bytes));
    S(refit_txn_stats, "TxnStats", M(refit_txn_stats, tensors_loaded);
      M(refit_txn_stats, modules_complete); M(refit_txn_stats, undo_device_bytes);
      M(refit_txn_stats, undo_host_bytes));
    S(refit_source_tensor, "SourceTensor", M(refit_source_tensor, name);
      M(refit_source_tensor, shape); M(refit_source_tensor, bytes); M(refit_source_tensor, file));
    /* refit/sys/cuda.h's counters, mirrored in refit/_sys.py */
    S(refit_sys_cuda_stats, "_sys.CudaStats", M(refit_sys_cuda_stats, batch_launches);
      M(refit_sys_cuda_stats, pageable_bytes); M(refit_sys_cuda_stats, queues);
      M(refit_sys_cuda_stats, ring_fill_wait_ns); M(refit_sys_cuda_stats, ring_dma_bytes));
    /* transport.h's, mirrored in refit/transport.py ("transport." names) */
    S(refit_nccl_id, "transport.NcclId", M(refit_nccl_id, bytes));
    S(refit_nccl_opts, "transport.NcclOpts", M(refit_nccl_opts, version);
      M(refit_nccl_opts, comm); M(refit_nccl_opts, id); M(refit_nccl_opts, nranks);
      M(refit_nccl_opts, rank); M(refit_nccl_opts, device); M(refit_nccl_opts, stream);
      M(refit_nccl_opts, timeout_s); M(refit_nccl_opts, abort_borrowed));
    S(refit_send_opts, "transport.SendOpts", M(refit_send_opts, version);
      M(refit_send_opts, version_label); M(refit_send_opts, bucket_bytes);
      M(refit_send_opts, root); M(refit_send_opts, checksum_payload);
      M(refit_send_opts, timeout_s); M(refit_send_opts, stream);
      M(refit_send_opts, direct_min_bytes));
    S(refit_recv_opts, "transport.RecvOpts", M(refit_recv_opts, version);
      M(refit_recv_opts, root); M(refit_recv_opts, timeout_s);
      M(refit_recv_opts, start_timeout_s); M(refit_recv_opts, stream);
      M(refit_recv_opts, max_bucket_bytes); M(refit_recv_opts, filter);
      M(refit_recv_opts, filter_user));
    S(refit_group_result, "transport.GroupResult", M(refit_group_result, decision);
      M(refit_group_result, local_status); M(refit_group_result, failed_rank);
      M(refit_group_result, vote_taken); M(refit_group_result, worker_status);
      M(refit_group_result, buckets); M(refit_group_result, tensors);
      M(refit_group_result, bytes); M(refit_group_result, seconds);
      M(refit_group_result, version_label));
    S(refit_ipc_send_opts, "ipc.SendOpts", M(refit_ipc_send_opts, version);
      M(refit_ipc_send_opts, device); M(refit_ipc_send_opts, stream);
      M(refit_ipc_send_opts, spin_s));
    S(refit_ipc_recv_opts, "ipc.RecvOpts", M(refit_ipc_recv_opts, version);
      M(refit_ipc_recv_opts, stream); M(refit_ipc_recv_opts, filter_user);
      M(refit_ipc_recv_opts, spin_s); M(refit_ipc_recv_opts, profile_gpu));
    S(refit_ipc_send_profile, "ipc.SendProfile", M(refit_ipc_send_profile, start_ns);
      M(refit_ipc_send_profile, end_ns));
    S(refit_ipc_recv_profile, "ipc.RecvProfile", M(refit_ipc_recv_profile, call_ns);
      M(refit_ipc_recv_profile, result_ns); M(refit_ipc_recv_profile, gpu_copy_ms));
    S(refit_ipc_stats, "ipc.Stats", M(refit_ipc_stats, source_sets_built));
    printf("}\n");
    return 0;
}
