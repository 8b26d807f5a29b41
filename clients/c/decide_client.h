/* A client for decide: one long-running `decide --ready` child (or the socket service), many calls.
 * C99 + POSIX (pthreads), no other dependency: copy decide_client.h and decide_client.c into your
 * project and build with -pthread. docs/embedding.md says more.
 *
 *   decide_error err;
 *   char *argv[] = {"/opt/decide/decide", "--model", "/opt/models/alarms", NULL};
 *   decide_client *client = decide_spawn(argv, 120, 30, &err);     // NULL: err.code, err.message
 *   decide_answer answer;
 *   if (decide_classify(client, "Pump 3 is leaking oil", &answer, &err) == 0) {
 *       printf("%s %.3f\n", answer.label ? answer.label : "(abstained)", answer.score);
 *       decide_answer_free(&answer);
 *   }
 *   decide_free(client);
 *
 * What it takes care of: the ready line; requests and answers move through one poll() loop with
 * non-blocking pipes, so neither side blocks on a full pipe, and a thread drains stderr; answers
 * are matched to requests by id (decide_classify_many pipelines every text at once); a timeout
 * per call (decide keeps running; a late answer is dropped); a child that dies fails the call in
 * flight with "connection_lost" and the next call restarts it, with backoff; SIGPIPE never reaches
 * your program. Threads may share a client: calls take turns (one call in flight at a time).
 * Errors: the protocol's codes ("empty_text", "busy", ...) or "timeout", "start_failed",
 * "connection_lost", "protocol_error", "closed" (and "out_of_memory").
 */
#ifndef DECIDE_CLIENT_H
#define DECIDE_CLIENT_H

#include <stddef.h>

typedef struct decide_client decide_client;

typedef struct {
    char *name;
    double value;
} decide_score;

typedef struct {
    char *label;          /* the decision; NULL when abstained */
    char *leaning;        /* the label the model leans to, always set */
    double score;         /* calibrated probability of leaning */
    decide_score *scores; /* every class probability */
    size_t n_scores;
    int abstained;
    char *reason;         /* why it abstained ("out_of_scope", ...), NULL otherwise */
    int truncated;        /* the text was cut to the model's length */
} decide_answer;

typedef struct {
    char code[32];
    char message[512];
} decide_error;

/* Start argv[0] with argv[1..] (NULL-terminated; "--ready" is added) and wait for its ready line.
 * timeout_s bounds every later call. NULL on failure (err says why). */
decide_client *decide_spawn(char *const argv[], double ready_timeout_s, double timeout_s, decide_error *err);

/* Use a running `decide serve --socket PATH`. NULL on failure. */
decide_client *decide_connect(const char *socket_path, double timeout_s, decide_error *err);

/* One UTF-8 text -> *answer (free it with decide_answer_free). 0, or -1 with err set. */
int decide_classify(decide_client *client, const char *text, decide_answer *answer, decide_error *err);

/* n texts, pipelined; answers[i] belongs to texts[i]. 0, or -1 with err (then no answer is set). */
int decide_classify_many(decide_client *client, const char *const *texts, size_t n, decide_answer *answers,
                         decide_error *err);

void decide_answer_free(decide_answer *answer);

/* Stop: requests already sent are answered, then the child exits (SIGTERM after 1 s, SIGKILL after 6 s);
 * later calls fail with "closed". Safe while other threads still call. */
void decide_close(decide_client *client);

/* Close (if not yet) and free the client, once no other thread uses it. */
void decide_free(decide_client *client);

#endif
