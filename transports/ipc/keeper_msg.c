/* The keeper's restore messages (keeper_msg.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <refit/refit.h>

#include "transports/ipc/keeper_msg.h"

static int k_bad(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int k_bad(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (errlen)
        vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return REFIT_ECORRUPT;
}

int ipc_hello_decode_member(ipc_hello *h, const ipc_frame *f, char *err, size_t errlen)
{
    int rc = ipc_hello_decode(h, f, IPC_ROLE_WORKER, err, errlen);
    if (rc && f->type == IPC_HELLO && f->len >= 4 &&
        (f->payload[0] | (uint32_t)f->payload[1] << 8 | (uint32_t)f->payload[2] << 16 |
         (uint32_t)f->payload[3] << 24) == IPC_ROLE_KEEPER)
        rc = ipc_hello_decode(h, f, IPC_ROLE_KEEPER, err, errlen);
    return rc;
}

static void w_str16(ipc_wbuf *w, const char *s, size_t max)
{
    size_t n = strlen(s);
    ipc_w16(w, (uint16_t)(n > max ? max : n));
}

void ipc_k_offer_encode(ipc_wbuf *w, const ipc_k_offer *o, const uint64_t *fps)
{
    ipc_w32(w, (uint32_t)o->status);
    w_str16(w, o->msg, IPC_MAX_MSG);
    ipc_w16(w, 0);
    size_t n = strlen(o->msg);
    ipc_w_bytes(w, o->msg, n > IPC_MAX_MSG ? IPC_MAX_MSG : n);
    if (o->status)
        return;
    size_t nl = strlen(o->label), nw = strlen(o->worker);
    ipc_w32(w, o->n_modules);
    ipc_w32(w, o->n_runtime);
    ipc_w32(w, o->sig_bytes);
    ipc_w16(w, (uint16_t)nl);
    ipc_w16(w, (uint16_t)nw);
    ipc_w64(w, (uint64_t)o->update_id);
    ipc_w32(w, o->pid);
    ipc_w32(w, 0);
    ipc_w_bytes(w, o->label, nl);
    ipc_w_bytes(w, o->worker, nw);
    ipc_w_bytes(w, o->sig, o->sig_bytes);
    for (uint32_t i = 0; i < o->n_modules; i++)
        ipc_w64(w, fps[i]);
    for (uint32_t i = 0; i < o->n_runtime; i++) {
        const ipc_k_place *p = &o->places[i];
        ipc_w32(w, p->mem);
        ipc_w32(w, 0);
        ipc_w64(w, p->data_off);
        ipc_w64(w, p->span_off);
        ipc_w64(w, p->span_bytes);
    }
}

/* A string of n bytes into out (cap + 1 bytes), no NUL inside. */
static int r_str(ipc_rbuf *r, uint16_t n, size_t cap, char *out)
{
    const uint8_t *p = ipc_r_bytes(r, n);
    if (!p || n > cap || memchr(p, 0, n))
        return -1;
    memcpy(out, p, n);
    out[n] = '\0';
    return 0;
}

int ipc_k_offer_decode(ipc_k_offer *o, const ipc_frame *f, uint32_t max_modules,
                       uint32_t max_runtime, char *err, size_t errlen)
{
    memset(o, 0, sizeof *o);
    if (f->type != IPC_K_OFFER)
        return k_bad(err, errlen, "keeper: a %s frame where K_OFFER was expected",
                     ipc_type_name(f->type));
    ipc_rbuf r = {.p = f->payload, .len = f->len};
    o->status = (int32_t)ipc_r32(&r);
    uint16_t nm = ipc_r16(&r);
    if (ipc_r16(&r) || r.short_read || r_str(&r, nm, IPC_MAX_MSG, o->msg))
        return k_bad(err, errlen, "K_OFFER: malformed head (%u bytes)", f->len);
    if (o->status > 0 || o->status < -1000)
        return k_bad(err, errlen, "K_OFFER: status %d is no refit status", o->status);
    if (o->status)
        return r.at == r.len ? REFIT_OK
                             : k_bad(err, errlen, "K_OFFER: %zu bytes after a refusal",
                                     r.len - r.at);
    o->n_modules = ipc_r32(&r);
    o->n_runtime = ipc_r32(&r);
    o->sig_bytes = ipc_r32(&r);
    uint16_t nl = ipc_r16(&r), nw = ipc_r16(&r);
    o->update_id = (int64_t)ipc_r64(&r);
    o->pid = ipc_r32(&r);
    uint32_t zero = ipc_r32(&r);
    if (r.short_read || zero)
        return k_bad(err, errlen, "K_OFFER: malformed (%u bytes)", f->len);
    if (o->n_modules > max_modules || o->n_runtime > max_runtime)
        return k_bad(err, errlen, "K_OFFER: %u modules and %u runtime tensors; this worker "
                     "has %u and %u", o->n_modules, o->n_runtime, max_modules, max_runtime);
    if (o->sig_bytes == 0 || o->sig_bytes > IPC_K_MAX_SIG)
        return k_bad(err, errlen, "K_OFFER: a signature of %u bytes", o->sig_bytes);
    if (r_str(&r, nl, BKT_MAX_LABEL, o->label) || r_str(&r, nw, IPC_K_MAX_ID, o->worker))
        return k_bad(err, errlen, "K_OFFER: its label or worker id is malformed");
    o->sig = (const char *)ipc_r_bytes(&r, o->sig_bytes);
    o->fps = ipc_r_bytes(&r, (size_t)o->n_modules * 8);
    size_t rest = (size_t)o->n_runtime * 32;
    if (!o->sig || !o->fps || r.len - r.at != rest)
        return k_bad(err, errlen, "K_OFFER: %u bytes; its counts say otherwise", f->len);
    o->places = calloc(o->n_runtime ? o->n_runtime : 1, sizeof *o->places);
    if (!o->places)
        return REFIT_ENOMEM;
    for (uint32_t i = 0; i < o->n_runtime; i++) {
        ipc_k_place *p = &o->places[i];
        p->mem = ipc_r32(&r);
        zero |= ipc_r32(&r);
        p->data_off = ipc_r64(&r);
        p->span_off = ipc_r64(&r);
        p->span_bytes = ipc_r64(&r);
    }
    if (zero || r.short_read) {
        ipc_k_offer_free(o); /* a refusal keeps nothing (tests/fuzz/fuzz_ipc.c) */
        return k_bad(err, errlen, "K_OFFER: a malformed placement");
    }
    return REFIT_OK;
}

void ipc_k_offer_free(ipc_k_offer *o)
{
    free(o->places);
    o->places = NULL;
}

uint64_t ipc_k_offer_fp(const ipc_k_offer *o, uint32_t module)
{
    return bkt_le64(o->fps + (size_t)module * 8);
}
