/* The control channel: frames over a Unix stream socket with deadlines
 * (chan.h has the layout). Every byte read is untrusted. */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <refit/refit.h>

#include "transports/ipc/chan.h"
#include "transports/nccl/bucket.h"
#include "core/errbuf.h"


void ipc_copy_str(char *dst, size_t n, const char *src)
{
    if (!n)
        return;
    size_t l = src ? strlen(src) : 0;
    if (l >= n)
        l = n - 1;
    if (l)
        memcpy(dst, src, l);
    dst[l] = '\0';
}

double ipc_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

uint64_t ipc_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int wait_ms(double deadline)
{
    double left = deadline - ipc_now();
    if (left <= 0)
        return 0;
    return left > 3600.0 ? 3600000 : (int)(left * 1000.0) + 1;
}

/* poll for ev by deadline: 1 ready, 0 deadline passed, -1 error. */
static int wait_fd(int fd, short ev, double deadline)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = ev};
        int n = poll(&p, 1, wait_ms(deadline));
        if (n > 0)
            return 1;
        if (n == 0 && ipc_now() >= deadline)
            return 0;
        if (n < 0 && errno != EINTR)
            return -1;
    }
}

static const char *TYPE_NAMES[] = {"?", "HELLO", "MEMS", "UPDATE", "VOTE", "DECISION", "RESULT",
                                   "INDEX"};

static const char *K_TYPE_NAMES[] = {"K_OFFER", "K_DONE", "K_CONFIRM"};

static int known_type(uint16_t type)
{
    return (type > 0 && type <= IPC_TYPE_MAX) || (type >= IPC_K_FIRST && type <= IPC_K_LAST);
}

const char *ipc_type_name(uint16_t type)
{
    if (type >= IPC_K_FIRST && type <= IPC_K_LAST)
        return K_TYPE_NAMES[type - IPC_K_FIRST];
    return type <= IPC_TYPE_MAX ? TYPE_NAMES[type] : "?";
}

/* ---- header ---- */

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

void ipc_header_encode(uint8_t out[IPC_FRAME_HEADER], uint16_t type, uint32_t len,
                       uint16_t n_fds, uint64_t payload_sum)
{
    memset(out, 0, IPC_FRAME_HEADER);
    put32(out, IPC_MAGIC);
    put16(out + 4, IPC_PROTO_VERSION);
    put16(out + 6, type);
    put32(out + 8, len);
    put16(out + 12, n_fds);
    put64(out + 16, payload_sum);
    put64(out + 24, bkt_checksum(out, 24));
}

int ipc_header_decode(const uint8_t in[IPC_FRAME_HEADER], uint16_t *type, uint32_t *len,
                      uint16_t *n_fds, uint64_t *payload_sum, uint32_t max_len, char *err,
                      size_t errlen)
{
    const int C = REFIT_ECORRUPT;
    if (get32(in) != IPC_MAGIC)
        return errbuf_set(err, errlen, C, "control frame: bad magic 0x%08x (not a refit IPC peer?)",
                    get32(in));
    uint16_t v = get16(in + 4);
    if (v != IPC_PROTO_VERSION)
        return errbuf_set(err, errlen, C, "control frame: protocol version %u; this refit speaks %u",
                    v, IPC_PROTO_VERSION);
    if (get64(in + 24) != bkt_checksum(in, 24))
        return errbuf_set(err, errlen, C, "control frame: header checksum mismatch");
    *type = get16(in + 6);
    *len = get32(in + 8);
    *n_fds = get16(in + 12);
    *payload_sum = get64(in + 16);
    if (!known_type(*type))
        return errbuf_set(err, errlen, C, "control frame: unknown type %u", *type);
    if (get16(in + 14))
        return errbuf_set(err, errlen, C, "control frame %s: unknown flags 0x%x", ipc_type_name(*type),
                    get16(in + 14));
    if (*len > max_len)
        return errbuf_set(err, errlen, C, "control frame %s: %u payload bytes, at most %u accepted",
                    ipc_type_name(*type), *len, max_len);
    if (*n_fds > IPC_MAX_FDS || (*n_fds && *type != IPC_MEMS))
        return errbuf_set(err, errlen, C, "control frame %s: announces %u descriptors (only MEMS "
                    "passes any, at most %d)", ipc_type_name(*type), *n_fds, IPC_MAX_FDS);
    return REFIT_OK;
}

/* ---- send ---- */

/* Write the header and the payload (one sendmsg while the socket takes
 * them: the peer wakes once for the whole frame), the descriptors with the
 * first byte. Poll only when the socket is full. */
static int send_all(int fd, const uint8_t *h, size_t hn, const uint8_t *p, size_t pn,
                    const int *fds, uint16_t n_fds, double deadline, char *err, size_t errlen)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * IPC_MAX_FDS)];
        struct cmsghdr align;
    } cm;
    size_t n = hn + pn, done = 0;
    bool full = false;
    while (done < n) {
        int w = full ? wait_fd(fd, POLLOUT, deadline) : 1;
        if (w == 0)
            return errbuf_set(err, errlen, REFIT_ETIMEDOUT, "control channel: deadline passed "
                        "sending (%zu of %zu bytes)", done, n);
        if (w < 0)
            return errbuf_set(err, errlen, REFIT_EIO, "control channel: poll: %s", strerror(errno));
        struct iovec iov[2];
        int k_iov = 0;
        if (done < hn)
            iov[k_iov++] = (struct iovec){.iov_base = (void *)(h + done), .iov_len = hn - done};
        size_t pd = done > hn ? done - hn : 0;
        if (pn > pd)
            iov[k_iov++] = (struct iovec){.iov_base = (void *)(p + pd), .iov_len = pn - pd};
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)k_iov};
        if (done == 0 && n_fds) {
            memset(&cm, 0, sizeof cm);
            msg.msg_control = cm.buf;
            msg.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
            struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
            memcpy(CMSG_DATA(c), fds, sizeof(int) * n_fds);
        }
        ssize_t k = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        full = k < 0 && errno == EAGAIN;
        if (k < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (k <= 0)
            return errbuf_set(err, errlen, REFIT_EIO, "control channel: the peer is gone (%s, "
                        "after %zu of %zu bytes)", k < 0 ? strerror(errno) : "closed", done, n);
        done += (size_t)k;
    }
    return REFIT_OK;
}

int ipc_send(int fd, uint16_t type, const void *payload, uint32_t len, const int *fds,
             uint16_t n_fds, double deadline, char *err, size_t errlen)
{
    if (n_fds > IPC_MAX_FDS || len > IPC_MAX_PAYLOAD)
        return errbuf_set(err, errlen, REFIT_EINVAL, "control frame %s: %u bytes, %u descriptors: "
                    "too large", ipc_type_name(type), len, n_fds);
    uint8_t h[IPC_FRAME_HEADER];
    ipc_header_encode(h, type, len, n_fds, bkt_checksum(payload, len));
    return send_all(fd, h, sizeof h, payload, len, fds, n_fds, deadline, err, errlen);
}

int ipc_spin_readable(int fd, double until)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 0) > 0)
            return 1;
        if (ipc_now() >= until)
            return 0;
        sched_yield(); /* the peer may need this core to answer */
    }
}

/* ---- receive ---- */

static void take_fds(ipc_frame *f, struct msghdr *msg, int *extra)
{
    for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        const unsigned char *d = CMSG_DATA(c);
        for (size_t i = 0; i < n; i++) {
            int v;
            memcpy(&v, d + i * sizeof v, sizeof v);
            if (f->n_fds < IPC_MAX_FDS)
                f->fds[f->n_fds++] = v;
            else {
                close(v);
                (*extra)++;
            }
        }
    }
}

static int recv_all(int fd, ipc_frame *f, uint8_t *p, size_t n, double deadline,
                    const char *what, int *truncated_ctl, char *err, size_t errlen)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * IPC_MAX_FDS)];
        struct cmsghdr align;
    } cm;
    size_t done = 0;
    bool empty = false;
    while (done < n) {
        int w = empty ? wait_fd(fd, POLLIN, deadline) : 1;
        if (w == 0)
            return errbuf_set(err, errlen, REFIT_ETIMEDOUT, "control channel: deadline passed "
                        "waiting for the %s (%zu of %zu bytes came)", what, done, n);
        if (w < 0)
            return errbuf_set(err, errlen, REFIT_EIO, "control channel: poll: %s", strerror(errno));
        struct iovec iov = {.iov_base = p + done, .iov_len = n - done};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf,
                             .msg_controllen = sizeof cm.buf};
        ssize_t k = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        empty = k < 0 && errno == EAGAIN;
        if (k < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        /* a peer that closed with our frames unread is reset (AF_UNIX):
         * it left all the same */
        if (k < 0 && errno != ECONNRESET)
            return errbuf_set(err, errlen, REFIT_EIO, "control channel: %s", strerror(errno));
        if (k <= 0)
            return errbuf_set(err, errlen, REFIT_EIO, done || strcmp(what, "frame header")
                        ? "control channel: truncated frame: the peer closed after %zu of "
                          "%zu bytes of the %s"
                        : "control channel: the peer closed the connection (%zu of %zu "
                          "bytes of the %s)", done, n, what);
        if (msg.msg_flags & MSG_CTRUNC)
            (*truncated_ctl)++;
        take_fds(f, &msg, truncated_ctl);
        done += (size_t)k;
    }
    return REFIT_OK;
}

int ipc_recv(int fd, ipc_frame *f, uint32_t max_len, double deadline, char *err, size_t errlen)
{
    memset(f, 0, sizeof *f);
    for (int i = 0; i < IPC_MAX_FDS; i++)
        f->fds[i] = -1;
    uint8_t h[IPC_FRAME_HEADER];
    int extra = 0;
    uint16_t n_fds = 0;
    uint64_t sum = 0;
    if (max_len > IPC_MAX_PAYLOAD)
        max_len = IPC_MAX_PAYLOAD;
    int rc = recv_all(fd, f, h, sizeof h, deadline, "frame header", &extra, err, errlen);
    if (!rc)
        rc = ipc_header_decode(h, &f->type, &f->len, &n_fds, &sum, max_len, err, errlen);
    if (!rc && f->len && !(f->payload = malloc(f->len)))
        rc = errbuf_set(err, errlen, REFIT_ENOMEM, "control frame %s: no memory for %u bytes",
                  ipc_type_name(f->type), f->len);
    if (!rc && f->len)
        rc = recv_all(fd, f, f->payload, f->len, deadline, "frame payload", &extra, err, errlen);
    if (!rc && (extra || f->n_fds != n_fds))
        rc = errbuf_set(err, errlen, REFIT_ECORRUPT, "control frame %s: %u descriptors announced, "
                  "%u received", ipc_type_name(f->type), n_fds, f->n_fds + extra);
    if (!rc && bkt_checksum(f->payload, f->len) != sum)
        rc = errbuf_set(err, errlen, REFIT_ECORRUPT, "control frame %s: payload checksum mismatch "
                  "(%u bytes)", ipc_type_name(f->type), f->len);
    if (rc)
        ipc_frame_free(f);
    return rc;
}

void ipc_frame_free(ipc_frame *f)
{
    free(f->payload);
    f->payload = NULL;
    for (int i = 0; i < f->n_fds; i++)
        if (f->fds[i] >= 0)
            close(f->fds[i]);
    f->n_fds = 0;
}

/* ---- sockets ---- */

static int sock_addr(const char *path, struct sockaddr_un *a, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    if (!path || !*path || strlen(path) >= sizeof a->sun_path)
        return errbuf_set(err, errlen, REFIT_EINVAL, "socket path '%s': empty or longer than %zu "
                    "bytes", path ? path : "(null)", sizeof a->sun_path - 1);
    memcpy(a->sun_path, path, strlen(path));
    return REFIT_OK;
}

/* Is a listener alive at a (connect accepted)? 1 yes, 0 no (refused:
 * stale), -1 cannot tell (errno). */
static int sock_live(const struct sockaddr_un *a)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -1;
    int rc = connect(fd, (const struct sockaddr *)a, sizeof *a);
    int e = errno;
    close(fd);
    if (rc == 0 || e == EAGAIN) /* accepted, or its backlog is full: alive */
        return 1;
    errno = e;
    return e == ECONNREFUSED ? 0 : -1;
}

int ipc_listen(const char *path, uint32_t mode, int *out, ipc_sock_id *id, char *err,
               size_t errlen)
{
    struct sockaddr_un a;
    int rc = sock_addr(path, &a, err, errlen);
    if (rc)
        return rc;
    if (mode & ~0777u)
        return errbuf_set(err, errlen, REFIT_EINVAL, "socket %s: mode 0%o (permission bits "
                    "only)", path, mode);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return errbuf_set(err, errlen, REFIT_EIO, "socket: %s", strerror(errno));
    /* bind never replaces a file: only a stale socket is removed, then
     * bound again (a live listener keeps its path) */
    for (int tries = 0; bind(fd, (struct sockaddr *)&a, sizeof a); tries++) {
        struct stat st;
        int e = errno, live = -1;
        if (e == EADDRINUSE && lstat(path, &st) == 0 && !S_ISSOCK(st.st_mode))
            rc = errbuf_set(err, errlen, REFIT_EINVAL, "socket path %s exists and is not a "
                      "socket; not replaced", path);
        else if (e == EADDRINUSE && tries == 0 && (live = sock_live(&a)) == 0 &&
                 unlink(path) == 0)
            continue; /* stale: its listener is gone */
        else if (live == 1)
            rc = errbuf_set(err, errlen, REFIT_EEXIST, "socket %s: a live listener is there "
                      "(another worker on this path?); not replaced", path);
        else
            rc = errbuf_set(err, errlen, REFIT_EIO, "bind %s: %s", path,
                      strerror(live < 0 && e == EADDRINUSE ? errno : e));
        close(fd);
        return rc;
    }
    /* the mode before listen: no one connects to a socket not listening */
    struct stat st;
    if (chmod(path, mode) || lstat(path, &st) || listen(fd, 4)) {
        rc = errbuf_set(err, errlen, REFIT_EIO, "listen on %s: %s", path, strerror(errno));
        unlink(path);
        close(fd);
        return rc;
    }
    *id = (ipc_sock_id){(uint64_t)st.st_dev, (uint64_t)st.st_ino};
    *out = fd;
    return REFIT_OK;
}

void ipc_unlink_own(const char *path, const ipc_sock_id *id)
{
    struct stat st;
    if (path && *path && lstat(path, &st) == 0 && S_ISSOCK(st.st_mode) &&
        (uint64_t)st.st_dev == id->dev && (uint64_t)st.st_ino == id->ino)
        unlink(path);
}

int ipc_peer_cred(int fd, uint32_t *uid, int32_t *pid, char *err, size_t errlen)
{
    struct ucred c;
    socklen_t n = sizeof c;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &n) || n != sizeof c)
        return errbuf_set(err, errlen, REFIT_EIO, "SO_PEERCRED: %s", strerror(errno));
    *uid = (uint32_t)c.uid;
    *pid = (int32_t)c.pid;
    return REFIT_OK;
}

int ipc_uid_allowed(uint32_t uid, const uint32_t *allow, uint32_t n)
{
    if (uid == (uint32_t)geteuid())
        return 1;
    for (uint32_t i = 0; allow && i < n; i++)
        if (allow[i] == uid)
            return 1;
    return 0;
}

int ipc_accept(int lfd, double deadline, int *out, char *err, size_t errlen)
{
    int w = wait_fd(lfd, POLLIN, deadline);
    if (w == 0)
        return errbuf_set(err, errlen, REFIT_ETIMEDOUT, "deadline passed waiting for a trainer "
                    "to connect");
    int fd = w < 0 ? -1 : accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
        return errbuf_set(err, errlen, REFIT_EIO, "accept: %s", strerror(errno));
    *out = fd;
    return REFIT_OK;
}

int ipc_connect(const char *path, double deadline, int *out, char *err, size_t errlen)
{
    struct sockaddr_un a;
    int rc = sock_addr(path, &a, err, errlen);
    if (rc)
        return rc;
    for (;;) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return errbuf_set(err, errlen, REFIT_EIO, "socket: %s", strerror(errno));
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
            *out = fd;
            return REFIT_OK;
        }
        int e = errno;
        close(fd);
        if ((e != ENOENT && e != ECONNREFUSED && e != EAGAIN) || ipc_now() >= deadline)
            return errbuf_set(err, errlen, e == ENOENT || e == ECONNREFUSED ? REFIT_ETIMEDOUT
                        : REFIT_EIO, "connect to %s: %s", path, strerror(e));
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* ---- payload writer / reader ---- */

void ipc_w_bytes(ipc_wbuf *w, const void *p, size_t n)
{
    if (w->failed)
        return;
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + n)
            cap *= 2;
        uint8_t *np = realloc(w->p, cap);
        if (!np) {
            w->failed = 1;
            return;
        }
        w->p = np;
        w->cap = cap;
    }
    if (n)
        memcpy(w->p + w->len, p, n);
    w->len += n;
}

void ipc_w16(ipc_wbuf *w, uint16_t v) { uint8_t b[2]; put16(b, v); ipc_w_bytes(w, b, 2); }
void ipc_w32(ipc_wbuf *w, uint32_t v) { uint8_t b[4]; put32(b, v); ipc_w_bytes(w, b, 4); }
void ipc_w64(ipc_wbuf *w, uint64_t v) { uint8_t b[8]; put64(b, v); ipc_w_bytes(w, b, 8); }

void ipc_wbuf_free(ipc_wbuf *w)
{
    free(w->p);
    memset(w, 0, sizeof *w);
}

const uint8_t *ipc_r_bytes(ipc_rbuf *r, size_t n)
{
    static const uint8_t none[1];
    if (r->short_read || n > r->len - r->at) {
        r->short_read = 1;
        return NULL;
    }
    if (!r->p)
        return none; /* an empty payload: nothing to point into */
    const uint8_t *p = r->p + r->at;
    r->at += n;
    return p;
}

uint16_t ipc_r16(ipc_rbuf *r) { const uint8_t *p = ipc_r_bytes(r, 2); return p ? get16(p) : 0; }
uint32_t ipc_r32(ipc_rbuf *r) { const uint8_t *p = ipc_r_bytes(r, 4); return p ? get32(p) : 0; }
uint64_t ipc_r64(ipc_rbuf *r) { const uint8_t *p = ipc_r_bytes(r, 8); return p ? get64(p) : 0; }
