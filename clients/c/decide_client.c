/* A client for decide (see decide_client.h). C99 + POSIX.1-2008, pthreads. */
#define _POSIX_C_SOURCE 200809L
#include "decide_client.h"

#include <errno.h>
#include <fcntl.h>
#include <locale.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

struct decide_client {
    pthread_mutex_t lock;               /* one call at a time */
    char **argv, *path;
    double ready_timeout, timeout, not_before;
    pid_t pid;                          /* -1: no child (the socket service, or none running) */
    int fd_in, fd_out, fd_err;          /* requests go to fd_in; answers, stderr come from fd_out, fd_err */
    char *out, *in;                     /* request bytes not written yet; answer bytes short of a line */
    size_t out_len, out_off, out_cap, in_len, in_cap, tail_len;
    long next_id, oldest;               /* answers come in request order: an id-less one is the oldest's */
    int answered, failures, closed;
    locale_t c_locale;                  /* numbers are read in the C locale, whatever the program's is */
    char tail[256], last[256];          /* the stderr line being read; the last complete one */
};

typedef struct { long first; size_t n, got; decide_answer *answers; int want_ready, failed; decide_error *err; } call;

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static void nap(double s) { struct timespec t = {(time_t)s, (long)((s - (time_t)s) * 1e9)}; if (s > 0) nanosleep(&t, NULL); }

static int fail(decide_error *e, const char *code, const char *fmt, ...) { /* set *e; -1 */
    va_list args;
    va_start(args, fmt), snprintf(e->code, sizeof e->code, "%s", code);
    vsnprintf(e->message, sizeof e->message, fmt, args);
    return va_end(args), -1;
}

static int grow(char **buf, size_t *cap, size_t need) { /* make *buf hold need bytes; -1: out of memory */
    size_t size = *cap ? *cap : 64;
    char *bigger = NULL;
    while (size < need) size *= 2;
    if (size != *cap && !(bigger = realloc(*buf, size))) return -1;
    if (bigger) *buf = bigger, *cap = size;
    return 0;
}

/* ---- JSON, as much as decide's lines need. decide writes UTF-8 as is: \u escapes only for controls. */
typedef struct { const char *p; int bad; locale_t loc; } json;

static int eat(json *j, const char *w) { /* whitespace, then the literal w if it is there */
    size_t n = strlen(w);
    j->p += strspn(j->p, " \t\r\n");
    return strncmp(j->p, w, n) == 0 ? (j->p += n, 1) : 0;
}
static char *string(json *j) { /* a malloc'ed UTF-8 copy of the JSON string at j->p */
    size_t len = 0, cap = 0;
    char *s = NULL, hex[5] = {0};
    const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t", *at;
    if (!eat(j, "\"")) j->bad = 1;
    while (!j->bad && grow(&s, &cap, len + 4) == 0) {
        unsigned char ch = (unsigned char)*j->p++;
        unsigned long cp;
        if (ch == '"') return s[len] = 0, s;
        if (ch < 0x20) break; /* the end of the line, or a raw control character */
        if (ch != '\\') { s[len++] = (char)ch; continue; }
        if ((ch = (unsigned char)*j->p++) == 'u' && strspn(j->p, "0123456789abcdefABCDEF") >= 4) {
            cp = strtoul(memcpy(hex, j->p, 4), NULL, 16);
            j->p += 4;
            if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD; /* (surrogates: decide does not write them) */
        } else if (ch && ch != 'u' && (at = strchr(from, ch))) cp = (unsigned char)to[at - from];
        else break;
        if (cp < 0x80) s[len++] = (char)cp;
        else if (cp < 0x800) s[len++] = (char)(0xC0 | cp >> 6), s[len++] = (char)(0x80 | (cp & 0x3F));
        else s[len++] = (char)(0xE0 | cp >> 12), s[len++] = (char)(0x80 | ((cp >> 6) & 0x3F)),
             s[len++] = (char)(0x80 | (cp & 0x3F));
    }
    free(s);
    j->bad = 1;
    return NULL;
}

static double number(json *j) {
    char *end;
    locale_t old = uselocale(j->loc);
    double v = (j->p += strspn(j->p, " \t\r\n"), strtod(j->p, &end));
    uselocale(old);
    j->bad |= end == j->p;
    return j->p = end, v;
}
static char *nullable(json *j) { return eat(j, "null") ? NULL : string(j); }
static int boolean(json *j) { return eat(j, "true") ? 1 : (eat(j, "false") ? 0 : (j->bad = 1, 0)); }

static void skip(json *j);
/* Calls field() (NULL: skip) for each member of the object at j->p, with the key; j->p at the value. */
static void object(json *j, void (*field)(json *, const char *, void *), void *ctx) {
    if (!eat(j, "{")) j->bad = 1;
    if (j->bad || eat(j, "}")) return;
    do {
        char *key = string(j);
        if (key && eat(j, ":")) field ? field(j, key, ctx) : skip(j);
        else j->bad = 1;
        free(key);
    } while (!j->bad && eat(j, ","));
    if (!j->bad && !eat(j, "}")) j->bad = 1;
}

static void skip(json *j) {
    j->p += strspn(j->p, " \t\r\n");
    if (*j->p == '"') free(string(j));
    else if (*j->p == '{') object(j, NULL, NULL);
    else if (eat(j, "[")) {
        if (eat(j, "]")) return;
        do skip(j); while (!j->bad && eat(j, ","));
        if (!j->bad && !eat(j, "]")) j->bad = 1;
    } else if (!eat(j, "true") && !eat(j, "false") && !eat(j, "null")) number(j);
}

typedef struct { int has_id, ready, is_error; long id; decide_answer a; char code[32], message[400]; } line_t;

static void error_field(json *j, const char *key, void *ctx) {
    line_t *l = ctx;
    int code = !strcmp(key, "code");
    char *s = code || !strcmp(key, "message") ? string(j) : (skip(j), NULL);
    if (s) snprintf(code ? l->code : l->message, code ? sizeof l->code : sizeof l->message, "%s", s);
    free(s);
}

static void score_field(json *j, const char *key, void *ctx) {
    decide_answer *a = ctx;
    decide_score *more = realloc(a->scores, (a->n_scores + 1) * sizeof *more);
    if (more) a->scores = more;
    if (!more || !(more[a->n_scores].name = strdup(key))) { j->bad = 1; return; }
    more[a->n_scores++].value = number(j);
}

static void line_field(json *j, const char *key, void *ctx) {
    line_t *l = ctx;
    char *event;
    if (!strcmp(key, "id")) {
        j->p += strspn(j->p, " \t\r\n");
        if ((*j->p == '-' || (*j->p >= '0' && *j->p <= '9')) && (l->has_id = 1)) l->id = (long)number(j);
        else skip(j); /* null: decide could not read that line */
    } else if (!strcmp(key, "event")) {
        l->ready = (event = nullable(j)) && !strcmp(event, "ready");
        free(event);
    } else if (!strcmp(key, "label")) l->a.label = nullable(j);
    else if (!strcmp(key, "leaning")) l->a.leaning = nullable(j);
    else if (!strcmp(key, "reason")) l->a.reason = nullable(j);
    else if (!strcmp(key, "score")) l->a.score = number(j);
    else if (!strcmp(key, "abstained")) l->a.abstained = boolean(j);
    else if (!strcmp(key, "truncated")) l->a.truncated = boolean(j);
    else if (!strcmp(key, "scores")) object(j, score_field, &l->a);
    else if (!strcmp(key, "error") && (l->is_error = 1)) object(j, error_field, l);
    else skip(j);
}

void decide_answer_free(decide_answer *a) {
    for (size_t i = 0; i < a->n_scores; i++) free(a->scores[i].name);
    free(a->scores), free(a->label), free(a->leaning), free(a->reason);
    memset(a, 0, sizeof *a);
}

/* ---- the link: a child process or a socket connection ---- */
static void read_stderr(decide_client *c) { /* what the child wrote to stderr; its last line is kept */
    char buf[4096];
    ssize_t n = c->fd_err < 0 ? -1 : read(c->fd_err, buf, sizeof buf);
    if (n == 0) close(c->fd_err), c->fd_err = -1;
    for (ssize_t i = 0; i < n; i++) {
        if (buf[i] != '\n' && c->tail_len < sizeof c->tail - 1) c->tail[c->tail_len++] = buf[i];
        if (buf[i] == '\n' && c->tail_len) memcpy(c->last, c->tail, c->tail_len), c->last[c->tail_len] = 0, c->tail_len = 0;
    }
}

/* Wait until the child exits (the service closes the connection), reading and dropping what it still
 * writes; SIGTERM after term_s, SIGKILL (the service: give up) after kill_s; then read its stderr to the
 * end. The wait status, or -1. */
static int reap(decide_client *c, double term_s, double kill_s) {
    char buf[4096];
    int status = -1, stage = 0, open = 1, r = 0; /* r: waitpid's answer */
    for (double t0 = now(), t; c->pid > 0 ? (r = waitpid(c->pid, &status, WNOHANG)) == 0 : open && stage < 2;) {
        struct pollfd p[2] = {{c->fd_out, POLLIN, 0}, {c->fd_err, POLLIN, 0}};
        if (poll(p, 2, 20) > 0 && p[1].revents) read_stderr(c);
        if (p[0].revents && read(c->fd_out, buf, sizeof buf) <= 0) open = 0, nap(0.02);
        if ((t = now() - t0) > term_s && stage == 0) stage = 1, (void)(c->pid > 0 && kill(c->pid, SIGTERM));
        else if (t > kill_s && stage == 1) stage = 2, (void)(c->pid > 0 && kill(c->pid, SIGKILL));
    }
    for (double end = now() + 0.5; c->fd_err >= 0 && now() < end;) {
        struct pollfd p = {c->fd_err, POLLIN, 0};
        if (poll(&p, 1, 50) > 0) read_stderr(c);
    }
    return c->pid > 0 && r == c->pid ? status : -1;
}

/* The link is gone: close it, forget what was in flight, back off before the next start. */
static void teardown(decide_client *c) {
    close(c->fd_err), close(c->fd_in); /* (-1: EBADF, nothing closed) */
    if (c->fd_out != c->fd_in) close(c->fd_out);
    c->fd_in = c->fd_out = c->fd_err = c->pid = -1;
    c->out_len = c->out_off = c->in_len = c->tail_len = 0;
    c->oldest = c->next_id;
    c->failures = c->answered ? 1 : c->failures + 1, c->answered = 0;
    c->not_before = now() + (c->failures > 6 ? 5.0 : 0.1 * (1 << (c->failures - 1)));
}

/* End the link with an error: `why` (NULL: how the child ended), and the child's last stderr line. */
static int drop(decide_client *c, decide_error *e, const char *code, const char *why, int kill_it) {
    char ended[160] = "the decide service closed the connection";
    int status;
    if (c->pid > 0) {
        if (kill_it) kill(c->pid, SIGKILL);
        if ((status = reap(c, 2, 2.5)) < 0) snprintf(ended, sizeof ended, "decide ended");
        else if (WIFSIGNALED(status)) snprintf(ended, sizeof ended, "decide was killed by signal %d (%s)",
                                               WTERMSIG(status), strsignal(WTERMSIG(status)));
        else snprintf(ended, sizeof ended, "decide exited with code %d", WEXITSTATUS(status));
    }
    fail(e, code, "%s%s%s", why ? why : ended, *c->last ? "; last stderr: " : "", c->last);
    teardown(c);
    return -1;
}

static int one_line(decide_client *c, call *k, const char *text) {
    line_t l = {0};
    json j = {text, 0, c->c_locale};
    long id, in_call;
    object(&j, line_field, &l);
    if (j.bad || j.p[strspn(j.p, " \t\r")]) l.is_error = -1;
    if (k->want_ready || l.is_error < 0 || (l.is_error && !l.has_id && !strcmp(l.code, "busy"))) {
        decide_answer_free(&l.a);
        if (l.is_error < 0) return drop(c, k->err, "protocol_error", "decide wrote a line that is not a JSON object", 1);
        if (!k->want_ready) return drop(c, k->err, "busy", l.message, 1); /* the service refuses us */
        if (!l.ready) return drop(c, k->err, "protocol_error", "the first line is not the ready line", 1);
        return k->want_ready = 0;
    }
    id = l.has_id ? l.id : c->oldest; /* no id: decide could not read that line, the oldest one */
    c->oldest = id + 1, c->answered = 1;
    in_call = id >= k->first && id < k->first + (long)k->n; /* else a late answer: its call timed out */
    if (in_call && l.is_error && !k->failed) k->failed = 1, fail(k->err, l.code, "%s", l.message);
    if (in_call && !l.is_error) decide_answer_free(&k->answers[id - k->first]), k->answers[id - k->first] = l.a;
    else decide_answer_free(&l.a);
    k->got += (size_t)in_call;
    return 0;
}

/* Write requests, read answers and stderr until the call has what it waits for, or its deadline. */
static int pump(decide_client *c, call *k, double deadline) {
    while (!k->failed && (k->want_ready || k->got < k->n)) {
        int writing = c->out_off < c->out_len;
        struct pollfd p[3] = {{c->fd_out, POLLIN, 0}, {c->fd_err, POLLIN, 0}, {writing ? c->fd_in : -1, POLLOUT, 0}};
        double left = deadline - now();
        ssize_t n;
        char *line, *nl;
        if (left <= 0) return k->want_ready ? fail(k->err, "start_failed", "no ready line within %g s", c->ready_timeout)
                                            : fail(k->err, "timeout", "no answer in time (decide runs on; a late answer is dropped)");
        if (poll(p, 3, (int)(left * 1000) + 1) < 0 && errno != EINTR) return drop(c, k->err, "connection_lost", strerror(errno), 1);
        if (p[1].revents) read_stderr(c);
        if (p[2].revents && (n = send(c->fd_in, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL)) < 0)
            c->out_off = errno == EAGAIN || errno == EINTR ? c->out_off : c->out_len; /* gone: the read says why */
        else if (p[2].revents && (c->out_off += (size_t)n) == c->out_len) c->out_off = c->out_len = 0;
        if (!p[0].revents) continue;
        if (grow(&c->in, &c->in_cap, c->in_len + 65537) < 0) return fail(k->err, "out_of_memory", "answer buffer");
        n = read(c->fd_out, c->in + c->in_len, 65536);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return drop(c, k->err, "connection_lost", NULL, 0);
        c->in_len += n > 0 ? (size_t)n : 0;
        c->in[c->in_len] = 0;
        for (line = c->in; (nl = memchr(line, '\n', c->in_len - (size_t)(line - c->in))); line = nl + 1)
            if ((*nl = 0, line[strspn(line, " \t\r")]) && one_line(c, k, line) < 0) return -1;
        c->in_len -= (size_t)(line - c->in);
        memmove(c->in, line, c->in_len);
    }
    return k->failed ? -1 : 0;
}

static int connect_socket(decide_client *c, decide_error *e) {
    struct sockaddr_un addr = {0};
    addr.sun_family = AF_UNIX;
    if (strlen(c->path) >= sizeof addr.sun_path) return fail(e, "start_failed", "socket path too long");
    strcpy(addr.sun_path, c->path);
    if ((c->fd_in = c->fd_out = socket(AF_UNIX, SOCK_STREAM, 0)) >= 0 && fcntl(c->fd_in, F_SETFD, FD_CLOEXEC) == 0
        && connect(c->fd_in, (struct sockaddr *)&addr, sizeof addr) == 0 && fcntl(c->fd_in, F_SETFL, O_NONBLOCK) == 0)
        return 0;
    return fail(e, "start_failed", "cannot connect to %s: %s", c->path, strerror(errno)), teardown(c), -1;
}

static int start(decide_client *c, decide_error *e) {
    /* stdin is a socket pair (writing to a dead child is then EPIPE without SIGPIPE: MSG_NOSIGNAL), fds 0
     * the child's end, 1 ours; stdout and stderr are pipes, 2 and 4 our read ends, 3 and 5 the child's. */
    int fds[6] = {-1, -1, -1, -1, -1, -1}, rc = 0;
    char why[sizeof e->message];
    call k = {0, 0, 0, NULL, 1, 0, e};
    posix_spawn_file_actions_t actions;
    if (c->path) return connect_socket(c, e);
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) < 0 || pipe(fds + 2) < 0 || pipe(fds + 4) < 0) rc = errno;
    for (int i = 0; i < 6; i++) if (fds[i] >= 0) fcntl(fds[i], F_SETFD, FD_CLOEXEC);
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[0], 0);
    posix_spawn_file_actions_adddup2(&actions, fds[3], 1);
    posix_spawn_file_actions_adddup2(&actions, fds[5], 2);
    if (rc == 0) rc = posix_spawnp(&c->pid, c->argv[0], &actions, NULL, c->argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    for (int i = 0; i < 6; i++) if (fds[i] >= 0 && (i == 0 || i == 3 || i == 5)) close(fds[i]); /* the child's */
    c->fd_in = fds[1], c->fd_out = fds[2], c->fd_err = fds[4];
    if (rc != 0) return c->pid = -1, teardown(c), fail(e, "start_failed", "cannot run %s: %s", c->argv[0], strerror(rc));
    for (int i = 1; i < 5; i++) if (i != 3) fcntl(fds[i], F_SETFL, O_NONBLOCK);
    if (pump(c, &k, now() + c->ready_timeout) == 0) return 0;
    snprintf(why, sizeof why, "%s", e->message);
    if (c->pid > 0) drop(c, e, "start_failed", why, 1), snprintf(why, sizeof why, "%s", e->message); /* + stderr */
    return fail(e, "start_failed", "decide did not become ready: %.480s", why);
}

static decide_client *open_client(char *const argv[], const char *path, double ready_s, double timeout_s,
                                  decide_error *e) {
    decide_client *c = calloc(1, sizeof *c);
    size_t n = 0, size = 2 * sizeof(char *) + sizeof "--ready";
    char *chars;
    for (; argv && argv[n]; n++) size += sizeof(char *) + strlen(argv[n]) + 1;
    if (c) pthread_mutex_init(&c->lock, NULL), c->fd_in = c->fd_out = c->fd_err = c->pid = -1;
    if (!c || !(c->c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0))
        || (path && !(c->path = strdup(path))) || (argv && !(c->argv = malloc(size))))
        return fail(e, "out_of_memory", "cannot allocate the client"), decide_free(c), NULL;
    for (size_t i = 0, chars_at = 0; argv && i <= n; i++) { /* a copy of argv + "--ready", in one block */
        chars = (char *)(c->argv + n + 2) + chars_at;
        chars_at += strlen(c->argv[i] = strcpy(chars, i < n ? argv[i] : "--ready")) + 1;
        c->argv[i + 1] = NULL;
    }
    c->ready_timeout = ready_s, c->timeout = timeout_s, c->next_id = c->oldest = 1;
    if (start(c, e) != 0) decide_free(c), c = NULL;
    return c;
}

decide_client *decide_spawn(char *const argv[], double ready_s, double timeout_s, decide_error *e) {
    return open_client(argv, NULL, ready_s, timeout_s, e);
}
decide_client *decide_connect(const char *path, double timeout_s, decide_error *e) {
    return open_client(NULL, path, timeout_s, timeout_s, e);
}

static int append_request(decide_client *c, long id, const char *text) {
    size_t len = strlen(text);
    if (grow(&c->out, &c->out_cap, c->out_len + len * 6 + 64) < 0) return -1;
    c->out_len += (size_t)sprintf(c->out + c->out_len, "{\"id\": %ld, \"text\": \"", id);
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)text[i];
        if (ch == '"' || ch == '\\') c->out[c->out_len++] = '\\';
        if (ch < 0x20) c->out_len += (size_t)sprintf(c->out + c->out_len, "\\u%04x", ch);
        else c->out[c->out_len++] = (char)ch; /* UTF-8 as is: decide checks it */
    }
    memcpy(c->out + c->out_len, "\"}\n", 3);
    return c->out_len += 3, 0;
}

int decide_classify_many(decide_client *c, const char *const *texts, size_t n, decide_answer *answers,
                         decide_error *e) {
    call k = {0, n, 0, answers, 0, 0, e};
    int rc;
    memset(answers, 0, n * sizeof *answers);
    pthread_mutex_lock(&c->lock); /* calls take turns; each is bounded by its own timeout */
    rc = c->closed ? fail(e, "closed", "the client was closed") : 0;
    if (rc == 0 && c->fd_out < 0) nap(c->not_before - now()), rc = start(c, e); /* restart, after the backoff */
    k.first = c->next_id;
    for (size_t i = 0; rc == 0 && i < n; i++)
        if (append_request(c, c->next_id++, texts[i]) < 0) rc = fail(e, "out_of_memory", "request buffer");
    if (rc == 0) rc = pump(c, &k, now() + c->timeout);
    for (size_t i = 0; rc != 0 && i < n; i++) decide_answer_free(&answers[i]);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int decide_classify(decide_client *c, const char *text, decide_answer *answer, decide_error *e) {
    return decide_classify_many(c, &text, 1, answer, e);
}

void decide_close(decide_client *c) {
    pthread_mutex_lock(&c->lock);
    c->closed = 1;
    if (c->fd_out >= 0) shutdown(c->fd_in, SHUT_WR), reap(c, 1, 6), teardown(c); /* EOF: decide answers what it read */
    pthread_mutex_unlock(&c->lock);
}

void decide_free(decide_client *c) {
    if (!c) return;
    decide_close(c);
    pthread_mutex_destroy(&c->lock);
    if (c->c_locale) freelocale(c->c_locale);
    free(c->argv), free(c->path), free(c->out), free(c->in), free(c);
}
