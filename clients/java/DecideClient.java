package decide;

import java.io.*;
import java.net.*;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.util.*;
import java.util.concurrent.*;
import java.util.concurrent.locks.LockSupport;
import java.util.stream.Collectors;

/**
 * A client for decide: one long-running {@code decide --ready} child (or the socket service, Java 16+), many
 * calls. Java 8+, no dependencies: copy this file into your project (package {@code decide}); docs/embedding.md.
 * <pre>
 * try (DecideClient client = DecideClient.spawn(Arrays.asList("/opt/decide/decide", "--model", "/opt/models/alarms"))) {
 *     String label = client.classify("Pump 3 is leaking oil").label;   // "leak"; null when abstained
 * }</pre>
 * Threads keep every pipe flowing; any number of requests are in flight, answers matched by id; a timeout per
 * call; a child that dies fails the calls in flight ({@code connection_lost}), the next call restarts it, with
 * backoff. Threads may share a client. Errors: {@link DecideException} with the protocol's code or
 * {@code timeout}, {@code start_failed}, {@code connection_lost}, {@code protocol_error}, {@code closed}.
 */
public final class DecideClient implements AutoCloseable {
    /** One text's decision: {@code label} is null when abstained; {@code leaning} is what the model leans to. */
    public static final class Answer {
        public final String label, leaning, reason;
        public final double score;
        public final Map<String, Double> scores = new LinkedHashMap<>();
        public final boolean abstained, truncated;
        Answer(Map<?, ?> m) {
            label = (String) m.get("label");
            leaning = (String) m.get("leaning");
            reason = (String) m.get("reason");
            score = ((Number) m.get("score")).doubleValue();
            for (Map.Entry<?, ?> e : ((Map<?, ?>) m.get("scores")).entrySet()) scores.put((String) e.getKey(), ((Number) e.getValue()).doubleValue());
            abstained = Boolean.TRUE.equals(m.get("abstained"));
            truncated = Boolean.TRUE.equals(m.get("truncated"));
        }
    }

    /** An error answer ({@link #code()} is the protocol's error code) or a failure of the client itself. */
    public static final class DecideException extends RuntimeException {
        private static final long serialVersionUID = 1L;
        private final String code;
        public DecideException(String code, String message) { super(message); this.code = code; }
        public String code() { return code; }
    }

    private static final ScheduledThreadPoolExecutor TIMER = new ScheduledThreadPoolExecutor(1, r -> daemon("decide-timeouts", r, false));
    static { TIMER.setRemoveOnCancelPolicy(true); }
    private static final byte[] EOF = new byte[0];

    private final List<String> command;
    private final String socketPath;
    private final long timeoutMs, readyTimeoutMs;
    private final Object startLock = new Object();
    private Link link;
    private int failures; // starts in a row that ended without any answer
    private long notBefore;
    private volatile boolean closed;
    private volatile Map<?, ?> ready;

    private DecideClient(List<String> command, String socketPath, long timeoutMs, long readyTimeoutMs) {
        this.command = command;
        this.socketPath = socketPath;
        this.timeoutMs = timeoutMs;
        this.readyTimeoutMs = readyTimeoutMs;
        current();
    }

    /** Start {@code command} ({@code --ready} is added) and wait until it is ready. */
    public static DecideClient spawn(List<String> command, long timeoutMs, long readyTimeoutMs) {
        return new DecideClient(new ArrayList<>(command), null, timeoutMs, readyTimeoutMs);
    }

    /** {@link #spawn(List, long, long)} with a 30 s call timeout and a 120 s ready timeout. */
    public static DecideClient spawn(List<String> command) { return spawn(command, 30_000, 120_000); }
    /** Use a running {@code decide serve --socket PATH} (Java 16+). */
    public static DecideClient connect(String socketPath, long timeoutMs) { return new DecideClient(null, socketPath, timeoutMs, timeoutMs); }
    /** The child's ready line (model, labels, limits), parsed; null for the socket service. */
    public Map<?, ?> ready() { return ready; }
    /** One text, answered within the client's timeout; throws DecideException. */
    public Answer classify(String text) { return await(classifyAsync(text, timeoutMs)); }

    /** Many texts, pipelined (one request line each, all in flight at once); answers in order; the first error throws. */
    public List<Answer> classifyMany(List<String> texts) {
        Link l = current();
        List<CompletableFuture<Answer>> futures = texts.stream().map(text -> l.request(text, timeoutMs)).collect(Collectors.toList());
        return futures.stream().map(DecideClient::await).collect(Collectors.toList());
    }

    /** Send one request now; the future completes with its answer or a DecideException (also on timeout). */
    public CompletableFuture<Answer> classifyAsync(String text, long timeoutMs) {
        CompletableFuture<Answer> failed = new CompletableFuture<>();
        try { return current().request(text, timeoutMs); } catch (DecideException e) { // (re)starting failed, or the link is gone
            failed.completeExceptionally(e);
            return failed;
        }
    }

    /** Stop: requests already sent are answered, then the child exits (SIGTERM, SIGKILL); later calls throw {@code closed}. */
    @Override public void close() {
        Link l;
        synchronized (startLock) { closed = true; l = link; link = null; }
        if (l != null) l.close(5000);
    }

    private static Answer await(CompletableFuture<Answer> future) {
        try { return future.join(); } catch (CompletionException e) { throw e.getCause() instanceof DecideException ? (DecideException) e.getCause() : e; }
    }

    private static Thread daemon(String name, Runnable body, boolean start) {
        Thread t = new Thread(body, name);
        t.setDaemon(true);
        if (start) t.start();
        return t;
    }

    /** The live link, (re)started if it ended: one start at a time, after 100 ms doubling to 5 s while starts fail. */
    private Link current() {
        synchronized (startLock) {
            if (closed) throw new DecideException("closed", "the client was closed");
            if (link != null && link.failure == null) return link;
            if (link != null) backOff(link.answered ? 1 : failures + 1, link.endedAt);
            link = null;
            for (long wait; (wait = notBefore - System.currentTimeMillis()) > 0;) LockSupport.parkNanos(wait * 1_000_000L);
            try {
                return link = socketPath != null ? open() : start();
            } catch (DecideException e) {
                backOff(failures + 1, System.currentTimeMillis());
                throw e;
            }
        }
    }

    private void backOff(int failures, long since) {
        this.failures = failures;
        notBefore = since + Math.min(100L << Math.min(failures - 1, 6), 5000L);
    }

    private Link open() {
        try { // Unix domain sockets came with Java 16: looked up by name, so that this file compiles for Java 8
            Object address = Class.forName("java.net.UnixDomainSocketAddress").getMethod("of", String.class).invoke(null, socketPath);
            SocketChannel channel = (SocketChannel) SocketChannel.class.getMethod("open", ProtocolFamily.class)
                .invoke(null, StandardProtocolFamily.valueOf("UNIX"));
            channel.connect((SocketAddress) address);
            // Not Channels.newInputStream/newOutputStream: their blocking read holds a lock their write needs (Java 17)
            return new Link(null, channel, new InputStream() {
                @Override public int read() { throw new UnsupportedOperationException(); }
                @Override public int read(byte[] b, int off, int len) throws IOException { return channel.read(ByteBuffer.wrap(b, off, len)); }
            }, new OutputStream() {
                @Override public void write(int b) { throw new UnsupportedOperationException(); }
                @Override public void write(byte[] b, int off, int len) throws IOException { for (ByteBuffer buf = ByteBuffer.wrap(b, off, len); buf.hasRemaining();) channel.write(buf); }
                @Override public void close() throws IOException { channel.shutdownOutput(); }
            });
        } catch (ReflectiveOperationException | IllegalArgumentException | IOException e) {
            String why = e instanceof IOException ? e.toString() : e.getCause() != null ? e.getCause().toString() : "Unix domain sockets need Java 16+";
            throw new DecideException("start_failed", "cannot connect to " + socketPath + ": " + why);
        }
    }

    private Link start() {
        Link l;
        try {
            List<String> argv = new ArrayList<>(command);
            argv.add("--ready");
            Process process = new ProcessBuilder(argv).start();
            l = new Link(process, null, process.getInputStream(), process.getOutputStream());
        } catch (IOException e) {
            throw new DecideException("start_failed", "cannot run " + command.get(0) + ": " + e.getMessage());
        }
        try {
            ready = l.ready.get(readyTimeoutMs, TimeUnit.MILLISECONDS);
            return l;
        } catch (InterruptedException | ExecutionException | TimeoutException e) {
            DecideException failure = l.failure;
            l.kill();
            String why = failure != null ? failure.getMessage() : "no ready line within " + readyTimeoutMs + " ms" + l.stderrNote();
            throw new DecideException("start_failed", "decide did not become ready: " + why);
        }
    }

    /** One child process or socket connection, with its requests in flight in sending order. The protocol answers every
     *  line once, in order: an answer carries our id, or null when decide could not read the line (line_too_long) - then
     *  it is the oldest request's; an id-less busy is the service refusing the connection. A timed-out request stays
     *  in pending, so that its late answer is recognised and dropped. */
    private final class Link {
        final Process process;
        final SocketChannel channel;
        final OutputStream out;
        final LinkedHashMap<Long, CompletableFuture<Answer>> pending = new LinkedHashMap<>();
        final BlockingQueue<byte[]> outbox = new LinkedBlockingQueue<>();
        final CompletableFuture<Map<?, ?>> ready = new CompletableFuture<>();
        final Thread reader, stderr;
        long nextId = 1, endedAt;
        volatile String lastStderr;
        volatile DecideException failure;
        volatile boolean answered, closing;

        Link(Process process, SocketChannel channel, InputStream in, OutputStream out) {
            this.process = process;
            this.channel = channel;
            this.out = out;
            if (process == null) ready.complete(null); // the socket service sends no ready line
            reader = daemon("decide-reader", () -> read(in), true);
            stderr = process == null ? null : daemon("decide-stderr", this::drainStderr, true);
            daemon("decide-writer", this::write, true);
        }

        CompletableFuture<Answer> request(String text, long timeoutMs) {
            CompletableFuture<Answer> future = new CompletableFuture<>();
            synchronized (this) { // ids, pending order and the line order on the wire agree
                if (failure != null) throw new DecideException(failure.code(), failure.getMessage());
                long id = nextId++;
                pending.put(id, future);
                outbox.add(("{\"id\": " + id + ", \"text\": " + Json.quote(text) + "}\n").getBytes(StandardCharsets.UTF_8));
            }
            ScheduledFuture<?> timer = TIMER.schedule(() -> future.completeExceptionally(new DecideException("timeout",
                "no answer within " + timeoutMs + " ms (decide runs on; a late answer is dropped)")), timeoutMs, TimeUnit.MILLISECONDS);
            future.whenComplete((answer, error) -> timer.cancel(false));
            return future;
        }

        private void write() {
            List<byte[]> lines = new ArrayList<>();
            try {
                while (!lines.contains(EOF)) {
                    lines.clear();
                    lines.add(outbox.take());
                    outbox.drainTo(lines, 255); // many small lines, one write
                    for (byte[] line : lines) out.write(line, 0, line.length);
                    out.flush();
                }
                out.close();
            } catch (IOException | InterruptedException e) { // the child or the service is gone:
                kill(); // the reader tells every request in flight why
            }
        }

        private void read(InputStream in) {
            ByteArrayOutputStream line = new ByteArrayOutputStream();
            byte[] buffer = new byte[65536];
            try {
                for (int n; (n = in.read(buffer, 0, buffer.length)) > 0;) {
                    for (int i = 0; i < n; i++) {
                        if (buffer[i] != '\n') { line.write(buffer[i]); continue; }
                        String text = new String(line.toByteArray(), StandardCharsets.UTF_8);
                        line.reset();
                        if (!text.trim().isEmpty()) answer(text);
                    }
                }
            } catch (IOException e) { /* the end of the stream, as EOF */
            } catch (RuntimeException e) { // a refusal, a line that is not the protocol's, an answer of another shape
                fail(e instanceof DecideException ? (DecideException) e : new DecideException("protocol_error", "decide wrote an answer this client cannot read: " + e));
                kill();
            }
            fail(ended());
        }

        private void answer(String line) {
            Object parsed = Json.parse(line);
            if (!(parsed instanceof Map)) throw new DecideException("protocol_error", "decide wrote a line that is not a JSON object: " + line);
            Map<?, ?> message = (Map<?, ?>) parsed, error = message.get("error") instanceof Map ? (Map<?, ?>) message.get("error") : null;
            if (!ready.isDone()) {
                if (!"ready".equals(message.get("event"))) throw new DecideException("protocol_error", "expected the ready line, got: " + line);
                ready.complete(message);
                return;
            }
            Object id = message.get("id");
            if (id == null && error != null && "busy".equals(error.get("code"))) // the service refuses this connection
                throw new DecideException("busy", String.valueOf(error.get("message")));
            CompletableFuture<Answer> future = null;
            synchronized (this) {
                if (id instanceof Double) future = pending.remove(((Double) id).longValue());
                else if (id == null && error != null && !pending.isEmpty()) future = pending.remove(pending.keySet().iterator().next()); // unreadable: the oldest
            }
            if (future == null) return; // a late answer: its call timed out
            answered = true;
            if (error != null) future.completeExceptionally(new DecideException(String.valueOf(error.get("code")), String.valueOf(error.get("message"))));
            else future.complete(new Answer(message));
        }

        private void drainStderr() {
            try (BufferedReader err = new BufferedReader(new InputStreamReader(process.getErrorStream(), StandardCharsets.UTF_8))) {
                for (String line; (line = err.readLine()) != null;) lastStderr = line;
            } catch (IOException e) { /* the child is gone */ }
        }
        String stderrNote() { // once the stderr thread has read what the child wrote
            try { if (stderr != null) stderr.join(1000); } catch (InterruptedException e) { Thread.currentThread().interrupt(); }
            return lastStderr == null ? "" : "; last stderr: " + lastStderr;
        }
        /** Why the stream ended: the child's exit code and last stderr line, or the service. */
        private DecideException ended() {
            if (closing) return new DecideException("closed", "the client was closed");
            if (process == null) return new DecideException("connection_lost", "the decide service closed the connection");
            if (!exited(2000)) kill(); // it closed stdout but lives on
            int code = exited(5000) ? process.exitValue() : -1; // (Java reports a signal as 128 + its number)
            String signal = code > 128 ? " (signal " + (code - 128) + "?)" : "";
            return new DecideException("connection_lost", "decide exited with code " + code + signal + stderrNote());
        }

        private boolean exited(long ms) {
            try { return process.waitFor(ms, TimeUnit.MILLISECONDS); } catch (InterruptedException e) { Thread.currentThread().interrupt(); }
            return !process.isAlive();
        }
        /** Fail every request in flight (and the ready wait) with error; later requests too. */
        void fail(DecideException error) {
            List<CompletableFuture<Answer>> waiting;
            synchronized (this) {
                if (failure == null) { failure = error; endedAt = System.currentTimeMillis(); }
                waiting = new ArrayList<>(pending.values());
                pending.clear();
            }
            outbox.add(EOF); // the writer ends
            ready.completeExceptionally(failure);
            for (CompletableFuture<Answer> f : waiting) f.completeExceptionally(failure);
        }
        void kill() {
            if (process != null) process.destroyForcibly();
            else try { channel.close(); } catch (IOException e) { /* closed already */ }
        }
        void close(long timeoutMs) { // EOF after the queued lines: decide answers what it read and exits
            closing = true;
            outbox.add(EOF);
            if (process != null && !exited(1000)) process.destroy(); // SIGTERM: the same, sooner
            if (process != null && !exited(timeoutMs)) process.destroyForcibly();
            try { reader.join(timeoutMs); } catch (InterruptedException e) { Thread.currentThread().interrupt(); }
            kill();
            fail(new DecideException("closed", "the client was closed"));
        }
    }

    /** Just enough JSON: objects, arrays, strings, numbers (as Double), true/false/null. */
    static final class Json {
        private final String s;
        private int i;
        private Json(String s) { this.s = s; }
        /** The value of a JSON text, or null if it is not JSON. */
        static Object parse(String text) {
            Json j = new Json(text);
            try { Object value = j.value(); return j.eat("") && j.i == text.length() ? value : null; }
            catch (IllegalArgumentException | IndexOutOfBoundsException e) { return null; }
        }

        static String quote(String text) {
            StringBuilder b = new StringBuilder(text.length() + 2).append('"');
            for (char c : text.toCharArray()) {
                if (c == '"' || c == '\\') b.append('\\');
                if (c < 0x20) b.append(String.format("\\u%04x", (int) c)); else b.append(c);
            }
            return b.append('"').toString();
        }
        private boolean eat(String w) { // whitespace, then w if it is there
            while (i < s.length() && " \t\r\n".indexOf(s.charAt(i)) >= 0) i++;
            return s.startsWith(w, i) && (i += w.length()) >= 0;
        }
        private Object expect(String end, Object value) { if (eat(end)) return value; throw new IllegalArgumentException(end + " expected"); }
        private Object value() {
            if (eat("{")) {
                Map<String, Object> m = new LinkedHashMap<>();
                if (eat("}")) return m;
                do {
                    String key = eat("\"") ? string() : null;
                    if (key == null || !eat(":")) throw new IllegalArgumentException("a key expected");
                    m.put(key, value());
                } while (eat(","));
                return expect("}", m);
            }
            if (eat("[")) {
                List<Object> list = new ArrayList<>();
                if (eat("]")) return list;
                do list.add(value()); while (eat(","));
                return expect("]", list);
            }
            if (eat("\"")) return string();
            if (eat("true")) return Boolean.TRUE;
            if (eat("false")) return Boolean.FALSE;
            if (eat("null")) return null;
            int start = i;
            while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) i++;
            return Double.valueOf(s.substring(start, i)); // (ids too: decide echoes ours, small integers)
        }

        private String string() { // after the opening quote
            StringBuilder b = new StringBuilder();
            for (char c; (c = s.charAt(i++)) != '"';) {
                if (c != '\\') { b.append(c); continue; }
                int at = "\"\\/bfnrt".indexOf(c = s.charAt(i++));
                if (at >= 0) b.append("\"\\/\b\f\n\r\t".charAt(at));
                else if (c == 'u') { b.append((char) Integer.parseInt(s.substring(i, i + 4), 16)); i += 4; }
                else throw new IllegalArgumentException("bad escape");
            }
            return b.toString();
        }
    }
}
