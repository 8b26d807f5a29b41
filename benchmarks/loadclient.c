/* Closed-loop load client for `decide serve --socket`, in C so that the client costs the box
 * almost no CPU: on a 2-core machine the Python client's JSON and asyncio work competes with the
 * server it measures. Same protocol and same rules as benchmarks/load.py's Python client: N
 * connections, each with exactly one request in flight; every answer's id is checked.
 *
 *   loadclient WHERE CLIENTS WARM_S SECONDS TEXTS_FILE
 *
 * WHERE: unix:PATH or tcp:HOST:PORT. TEXTS_FILE: one JSON-encoded string per line (the "text"
 * value, already escaped); client c starts at text c*7919 and cycles. Prints one JSON object:
 * requests and errors counted after WARM_S, measured seconds, client CPU seconds, and the
 * latency of every measured answer in microseconds (load.py computes the percentiles).
 * Built by load.py with `cc -O2`; exits 2 with a message on stderr on any failure.
 */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what) {
    fprintf(stderr, "loadclient: %s: %s\n", what, errno ? strerror(errno) : "failed");
    exit(2);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int connect_to(const char *where) {
    if (strncmp(where, "unix:", 5) == 0) {
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        if (strlen(where + 5) >= sizeof addr.sun_path) die("socket path too long");
        strcpy(addr.sun_path, where + 5);
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) die(where);
        return fd;
    }
    if (strncmp(where, "tcp:", 4) == 0) {
        char host[256];
        const char *colon = strrchr(where + 4, ':');
        if (!colon || (size_t)(colon - where - 4) >= sizeof host) die("tcp:HOST:PORT expected");
        memcpy(host, where + 4, colon - where - 4);
        host[colon - where - 4] = 0;
        char *h = host;
        if (h[0] == '[') { h++; h[strlen(h) - 1] = 0; }
        struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
        if (getaddrinfo(h, colon + 1, &hints, &res) != 0) die("getaddrinfo");
        int fd = socket(res->ai_family, SOCK_STREAM, 0);
        if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) < 0) die(where);
        freeaddrinfo(res);
        return fd;
    }
    errno = 0;
    die("WHERE must be unix:PATH or tcp:HOST:PORT");
    return -1;
}

typedef struct {
    int fd;
    long next_id;     /* id of the request in flight */
    double sent_at;
    char *buf;        /* answer bytes received so far */
    size_t used, cap;
} Conn;

static char **texts;
static size_t n_texts;

static void send_request(Conn *c) {
    char head[64];
    const char *text = texts[c->next_id % n_texts];
    int n = snprintf(head, sizeof head, "{\"id\": %ld, \"text\": ", c->next_id);
    size_t len = strlen(text);
    char *line = malloc(n + len + 3);
    memcpy(line, head, n);
    memcpy(line + n, text, len);
    memcpy(line + n + len, "}\n", 2);
    size_t total = n + len + 2, done = 0;
    c->sent_at = now();
    while (done < total) {  /* blocking socket: a request line is small */
        ssize_t w = write(c->fd, line + done, total - done);
        if (w < 0 && errno != EINTR) die("write");
        if (w > 0) done += w;
    }
    free(line);
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: loadclient WHERE CLIENTS WARM_S SECONDS TEXTS_FILE\n");
        return 2;
    }
    int clients = atoi(argv[2]);
    double warm = atof(argv[3]), seconds = atof(argv[4]);
    if (clients < 1) { errno = 0; die("CLIENTS must be >= 1"); }

    FILE *f = fopen(argv[5], "r");
    if (!f) die(argv[5]);
    size_t cap = 64;
    texts = malloc(cap * sizeof *texts);
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t got;
    while ((got = getline(&line, &line_cap, f)) > 0) {
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        if (got == 0) continue;
        if (n_texts == cap) texts = realloc(texts, (cap *= 2) * sizeof *texts);
        texts[n_texts++] = strdup(line);
    }
    fclose(f);
    if (n_texts == 0) { errno = 0; die("no texts"); }

    Conn *conns = calloc(clients, sizeof *conns);
    struct pollfd *pfds = calloc(clients, sizeof *pfds);
    size_t lat_cap = 1 << 16, n_lat = 0;
    unsigned *latencies = malloc(lat_cap * sizeof *latencies);
    long errors = 0;
    double measure_from = now() + warm, stop_at = measure_from + seconds;
    for (int i = 0; i < clients; i++) {
        conns[i].fd = connect_to(argv[1]);
        conns[i].next_id = (long)i * 7919;
        conns[i].cap = 1 << 16;
        conns[i].buf = malloc(conns[i].cap);
        pfds[i].fd = conns[i].fd;
        pfds[i].events = POLLIN;
        send_request(&conns[i]);
    }

    int open = clients;
    while (open > 0) {
        if (poll(pfds, clients, 1000) < 0) {
            if (errno == EINTR) continue;
            die("poll");
        }
        for (int i = 0; i < clients; i++) {
            if (pfds[i].fd < 0 || !(pfds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            Conn *c = &conns[i];
            if (c->cap - c->used < 4096) c->buf = realloc(c->buf, c->cap *= 2);
            ssize_t r = read(c->fd, c->buf + c->used, c->cap - c->used - 1);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) { errno = 0; die("the server closed a connection with a request in flight"); }
            c->used += r;
            char *nl = memchr(c->buf, '\n', c->used);
            if (!nl) continue;
            double done = now();
            *nl = 0;
            /* answers start {"id": N, ... (runtime/protocol.py writes the id first) */
            char *id_at = strstr(c->buf, "\"id\":");
            long id = id_at ? strtol(id_at + 5, NULL, 10) : -1;
            if (id != c->next_id) {
                fprintf(stderr, "loadclient: answer %.200s on a connection waiting for id %ld\n", c->buf, c->next_id);
                return 2;
            }
            if (c->sent_at >= measure_from) {
                if (strstr(c->buf, "\"error\":")) errors++;
                else {
                    if (n_lat == lat_cap) latencies = realloc(latencies, (lat_cap *= 2) * sizeof *latencies);
                    latencies[n_lat++] = (unsigned)((done - c->sent_at) * 1e6);
                }
            }
            size_t rest = c->used - (nl + 1 - c->buf);
            if (rest) { errno = 0; die("more than one answer for one request"); }
            c->used = 0;
            if (done < stop_at) {
                c->next_id++;
                send_request(c);
            } else {
                close(c->fd);
                pfds[i].fd = -1;
                open--;
            }
        }
    }
    double measured = now() - measure_from;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
    printf("{\"requests\": %zu, \"errors\": %ld, \"seconds\": %.6f, \"cpu_s\": %.6f, \"latencies_us\": [",
           n_lat, errors, measured, cpu);
    for (size_t i = 0; i < n_lat; i++) printf(i ? ",%u" : "%u", latencies[i]);
    printf("]}\n");
    return 0;
}
