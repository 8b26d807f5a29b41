/* The C client's conformance harness: the command language of tests/clients/harness.py.
 * C has no asynchronous calls: `async` is decide_classify_many (every text in flight at once). */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "decide_client.h"

#define MAX_CLIENTS 16

static struct { char name[32]; decide_client *client; } clients[MAX_CLIENTS];

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void put_string(const char *s) { /* a JSON string on stdout */
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') printf("\\%c", ch);
        else if (ch < 0x20) printf("\\u%04x", ch);
        else putchar(ch);
    }
    putchar('"');
}

static decide_client **slot(const char *name) {
    for (int i = 0; i < MAX_CLIENTS; i++)
        if (!strcmp(clients[i].name, name) || !clients[i].name[0]) {
            snprintf(clients[i].name, sizeof clients[i].name, "%s", name);
            return &clients[i].client;
        }
    fprintf(stderr, "harness: too many clients\n");
    exit(2);
}

static char **read_lines(const char *path, size_t *n) { /* the file's lines, split at "\n" only */
    FILE *file = fopen(path, "rb");
    char **lines = NULL, *line = NULL;
    size_t cap = 0;
    ssize_t len;
    *n = 0;
    if (!file) { perror(path); exit(2); }
    while ((len = getline(&line, &cap, file)) > 0) {
        lines = realloc(lines, (*n + 1) * sizeof *lines);
        if (line[len - 1] == '\n') line[len - 1] = 0;
        lines[(*n)++] = strdup(line);
    }
    free(line);
    fclose(file);
    return lines;
}

static void free_lines(char **lines, size_t n) {
    for (size_t i = 0; i < n; i++) free(lines[i]);
    free(lines);
}

/* The label ("!code: message" for a failed call) as JSON. */
static void put_label(const decide_answer *a, const decide_error *e, int ok) {
    char failed[sizeof e->code + sizeof e->message + 4];
    if (!ok) snprintf(failed, sizeof failed, "!%s: %s", e->code, e->message), put_string(failed);
    else if (a->label) put_string(a->label);
    else printf("null");
}

typedef struct { decide_client *client; char **texts; size_t n_texts; int t, m; char **labels; } worker;

static void *work(void *arg) {
    worker *w = arg;
    for (int j = 0; j < w->m; j++) {
        int i = w->t * w->m + j, n;
        decide_answer a;
        decide_error e;
        int ok = decide_classify(w->client, w->texts[(size_t)i % w->n_texts], &a, &e) == 0;
        const char *label = ok ? (a.label ? a.label : NULL) : e.code;
        n = snprintf(NULL, 0, "%s%s%s%s", ok ? "" : "!", label ? label : "", ok ? "" : ": ", ok ? "" : e.message);
        w->labels[i] = label ? malloc((size_t)n + 1) : NULL;
        if (label) snprintf(w->labels[i], (size_t)n + 1, "%s%s%s%s", ok ? "" : "!", label, ok ? "" : ": ", ok ? "" : e.message);
        if (ok) decide_answer_free(&a);
    }
    return NULL;
}

static int run(char **f, int nf, decide_error *e) {
    decide_client **c = nf > 1 && strcmp(f[0], "sleep") ? slot(f[1]) : NULL;
    if (!strcmp(f[0], "spawn")) {
        char **argv = calloc((size_t)nf, sizeof *argv);
        memcpy(argv, f + 4, (size_t)(nf - 4) * sizeof *argv);
        *c = decide_spawn(argv, atof(f[2]), atof(f[3]), e);
        free(argv);
        return *c ? 0 : -1;
    }
    if (!strcmp(f[0], "connect")) return (*c = decide_connect(f[3], atof(f[2]), e)) ? 0 : -1;
    if (!strcmp(f[0], "one")) {
        int repeat = atoi(f[2]);
        size_t len = strlen(f[3]);
        char *text = malloc(len * (size_t)repeat + 1);
        decide_answer a;
        for (int i = 0; i < repeat; i++) memcpy(text + len * (size_t)i, f[3], len);
        text[len * (size_t)repeat] = 0;
        if (decide_classify(*c, text, &a, e) != 0) return free(text), -1;
        free(text);
        printf("{\"label\": ");
        put_label(&a, e, 1);
        printf(", \"leaning\": ");
        put_string(a.leaning ? a.leaning : "");
        printf(", \"score\": %.6f, \"abstained\": %s, \"reason\": ", a.score, a.abstained ? "true" : "false");
        if (a.reason) put_string(a.reason);
        else printf("null");
        printf(", \"truncated\": %s, ", a.truncated ? "true" : "false");
        decide_answer_free(&a);
        return 0;
    }
    if (!strcmp(f[0], "many") || !strcmp(f[0], "async")) {
        size_t n;
        char **texts = read_lines(f[2], &n);
        decide_answer *answers = calloc(n + 1, sizeof *answers);
        int ok;
        if (nf > 3 && !strcmp(f[3], "inflight")) printf("{\"event\": \"inflight\"}\n"), fflush(stdout);
        ok = decide_classify_many(*c, (const char *const *)texts, n, answers, e) == 0;
        if (!ok && !strcmp(f[0], "many")) return free_lines(texts, n), free(answers), -1;
        printf("{\"labels\": [");
        for (size_t i = 0; i < n; i++) {
            if (i) printf(", ");
            put_label(&answers[i], e, ok);
            if (ok) decide_answer_free(&answers[i]);
        }
        printf("], ");
        free_lines(texts, n);
        free(answers);
        return 0;
    }
    if (!strcmp(f[0], "threads")) {
        int n = atoi(f[2]), m = atoi(f[3]);
        size_t n_texts;
        char **texts = read_lines(f[4], &n_texts), **labels = calloc((size_t)(n * m), sizeof *labels);
        worker *workers = calloc((size_t)n, sizeof *workers);
        pthread_t *threads = calloc((size_t)n, sizeof *threads);
        for (int t = 0; t < n; t++) {
            workers[t] = (worker){*c, texts, n_texts, t, m, labels};
            pthread_create(&threads[t], NULL, work, &workers[t]);
        }
        for (int t = 0; t < n; t++) pthread_join(threads[t], NULL);
        printf("{\"labels\": [");
        for (int i = 0; i < n * m; i++) {
            printf(i ? ", " : "");
            if (labels[i]) put_string(labels[i]);
            else printf("null");
            free(labels[i]);
        }
        printf("], ");
        free_lines(texts, n_texts);
        free(labels);
        free(workers);
        free(threads);
        return 0;
    }
    if (!strcmp(f[0], "sleep")) {
        struct timespec t = {atoi(f[1]) / 1000, (atoi(f[1]) % 1000) * 1000000L};
        nanosleep(&t, NULL);
    } else if (!strcmp(f[0], "close")) decide_close(*c); /* kept: later calls must fail with "closed" */
    else fprintf(stderr, "harness: unknown command %s\n", f[0]), exit(2);
    return 0;
}

int main(void) {
    char *line = NULL, *fields[256];
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, stdin)) > 0) {
        int nf = 0;
        double started = now_ms();
        decide_error e;
        if (line[len - 1] == '\n') line[len - 1] = 0;
        for (char *p = line; nf < 255; p++) { /* split at TABs, keeping empty fields */
            fields[nf++] = p;
            if (!(p = strchr(p, '\t'))) break;
            *p = 0;
        }
        fields[nf] = NULL;
        if (run(fields, nf, &e) != 0) {
            printf("{\"error_code\": ");
            put_string(e.code);
            printf(", \"error_message\": ");
            put_string(e.message);
            printf(", ");
        } else if (strcmp(fields[0], "one") && strcmp(fields[0], "many") && strcmp(fields[0], "async")
                   && strcmp(fields[0], "threads")) printf("{");
        printf("\"cmd\": ");
        put_string(fields[0]);
        printf(", \"elapsed_ms\": %.1f}\n", now_ms() - started);
        fflush(stdout);
    }
    for (int i = 0; i < MAX_CLIENTS; i++) decide_free(clients[i].client);
    free(line);
    return 0;
}
