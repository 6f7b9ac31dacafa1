#include <refit/refit.h>

const char *refit_strerror(int status)
{
    switch (status) {
#define REFIT_X_(name, value, desc) case value: return desc;
        REFIT_STATUS_TABLE(REFIT_X_)
#undef REFIT_X_
    default:
        return "unknown status";
    }
}

const char *refit_status_name(int status)
{
    switch (status) {
#define REFIT_X_(name, value, desc) case value: return "REFIT_" #name;
        REFIT_STATUS_TABLE(REFIT_X_)
#undef REFIT_X_
    default:
        return "REFIT_UNKNOWN";
    }
}

const char *refit_health_name(refit_health h)
{
    switch (h) {
    case REFIT_HEALTH_EMPTY: return "EMPTY";
    case REFIT_HEALTH_READY: return "READY";
    case REFIT_HEALTH_UPDATING: return "UPDATING";
    case REFIT_HEALTH_POISONED: return "POISONED";
    }
    return "UNKNOWN";
}

const char *refit_dtype_name(refit_dtype dt)
{
    if (dt.lanes != 1)
        return "?";
    switch (dt.code) {
    case REFIT_DTYPE_FLOAT:
        return dt.bits == 32 ? "f32" : dt.bits == 16 ? "f16" : dt.bits == 64 ? "f64" : "?";
    case REFIT_DTYPE_BFLOAT:
        return dt.bits == 16 ? "bf16" : "?";
    case REFIT_DTYPE_INT:
        return dt.bits == 8 ? "i8" : dt.bits == 16 ? "i16" : dt.bits == 32 ? "i32"
             : dt.bits == 64 ? "i64" : "?";
    case REFIT_DTYPE_UINT:
        return dt.bits == 8 ? "u8" : dt.bits == 16 ? "u16" : dt.bits == 32 ? "u32"
             : dt.bits == 64 ? "u64" : "?";
    case REFIT_DTYPE_BOOL:
        return dt.bits == 8 ? "bool" : "?";
    case REFIT_DTYPE_FLOAT8_E4M3FN: return dt.bits == 8 ? "f8_e4m3" : "?";
    case REFIT_DTYPE_FLOAT8_E5M2: return dt.bits == 8 ? "f8_e5m2" : "?";
    case REFIT_DTYPE_FLOAT8_E8M0FNU: return dt.bits == 8 ? "f8_e8m0" : "?";
    case REFIT_DTYPE_FLOAT4_E2M1FN: return dt.bits == 4 ? "f4_e2m1" : "?";
    default:
        return "?";
    }
}
