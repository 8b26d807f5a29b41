// A client for decide: one long-running `decide --ready` child (or the socket service), many calls. .NET Standard
// 2.0, no dependencies (builds with Mono's mcs and with the .NET SDK): copy this file into your project.
//
//   using (var client = DecideClient.Spawn("/opt/decide/decide", new[] { "--model", "/opt/models/alarms" })) {
//       string label = client.Classify("Pump 3 is leaking oil").Label;   // "leak"; null when abstained
//   }
// Threads keep every pipe flowing; any number of requests are in flight, answers matched by id; a timeout per call;
// a child that dies fails the calls in flight ("connection_lost"), the next call restarts it, with backoff. Threads may
// share a client. Errors: DecideException with the protocol's code or "timeout", "start_failed", "connection_lost",
// "protocol_error", "closed". docs/embedding.md says more.
using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.Diagnostics;
using System.Globalization;
using System.IO;
using System.Linq;
using System.Net;
using System.Net.Sockets;
using System.Text;
using System.Threading;
using System.Threading.Tasks;

namespace Decide {
    /// <summary>One text's decision: Label is null when abstained; Leaning is what the model leans to.</summary>
    public sealed class Answer {
        public string Label { get; internal set; }
        public string Leaning { get; internal set; }
        public double Score { get; internal set; }
        public Dictionary<string, double> Scores { get; } = new Dictionary<string, double>();
        public bool Abstained { get; internal set; }
        public string Reason { get; internal set; }
        public bool Truncated { get; internal set; }
    }

    /// <summary>An error answer (Code is the protocol's error code) or a failure of the client itself.</summary>
    public sealed class DecideException : Exception {
        public string Code { get; }
        public DecideException(string code, string message) : base(message) { Code = code; }
    }

    public sealed class DecideClient : IDisposable {
        private static readonly byte[] Eof = new byte[0];
        private readonly string fileName, arguments, socketPath;
        private readonly TimeSpan timeout, readyTimeout;
        private readonly object startLock = new object();
        private Link link;
        private int failures; // starts in a row that ended without any answer
        private DateTime notBefore = DateTime.MinValue;
        private volatile bool closed;

        /// <summary>The child's ready line (model, labels, limits), parsed; null for the socket service.</summary>
        public Dictionary<string, object> Ready { get; private set; }
        private DecideClient(string fileName, IEnumerable<string> args, string socketPath, TimeSpan timeout, TimeSpan readyTimeout) {
            this.fileName = fileName;
            arguments = args == null ? null : string.Join(" ", args.Concat(new[] { "--ready" }).Select(QuoteArgument));
            this.socketPath = socketPath;
            this.timeout = timeout;
            this.readyTimeout = readyTimeout;
            Current();
        }

        /// <summary>Start fileName with args ("--ready" is added) and wait until it is ready (default: 30 s per call, 120 s to start).</summary>
        public static DecideClient Spawn(string fileName, IEnumerable<string> args, TimeSpan? timeout = null, TimeSpan? readyTimeout = null) {
            return new DecideClient(fileName, args, null, timeout ?? TimeSpan.FromSeconds(30), readyTimeout ?? TimeSpan.FromSeconds(120));
        }

        /// <summary>Use a running `decide serve --socket PATH`.</summary>
        public static DecideClient Connect(string socketPath, TimeSpan? timeout = null) {
            return new DecideClient(null, null, socketPath, timeout ?? TimeSpan.FromSeconds(30), timeout ?? TimeSpan.FromSeconds(30));
        }

        /// <summary>One text, answered within the client's timeout; throws DecideException.</summary>
        public Answer Classify(string text) { return ClassifyAsync(text).GetAwaiter().GetResult(); }

        /// <summary>Many texts, pipelined (one request line each, all in flight at once); answers in order; the first error throws.</summary>
        public IList<Answer> ClassifyMany(IEnumerable<string> texts) {
            Link l = Current();
            List<Task<Answer>> tasks = texts.Select(text => l.Request(text, timeout)).ToList();
            return tasks.Select(task => task.GetAwaiter().GetResult()).ToList();
        }

        /// <summary>Send one request now; the task ends with its answer or a DecideException (also on timeout).</summary>
        public Task<Answer> ClassifyAsync(string text, TimeSpan? timeout = null) {
            try { return Current().Request(text, timeout ?? this.timeout); }
            catch (DecideException e) { return Task.FromException<Answer>(e); } // (re)starting failed, or the link is gone
        }

        /// <summary>Stop: requests already sent are answered, then the child exits (killed after 5 s); later calls throw "closed".</summary>
        public void Dispose() {
            Link l;
            lock (startLock) { closed = true; l = link; link = null; }
            if (l != null) l.Close(TimeSpan.FromSeconds(5));
        }

        // .NET Standard 2.0's Process takes one argument string: quoted the way .NET splits it (backslashes double only
        // before a quote). Mono splits it like a POSIX shell; the two agree unless an argument holds a backslash.
        private static string QuoteArgument(string arg) {
            if (arg.Length > 0 && arg.IndexOfAny(new[] { ' ', '\t', '"', '\\', '\'' }) < 0) return arg;
            var b = new StringBuilder("\"");
            int slashes = 0;
            foreach (char c in arg) {
                if (c == '\\') { slashes++; continue; }
                b.Append('\\', c == '"' ? 2 * slashes + 1 : slashes).Append(c);
                slashes = 0;
            }
            return b.Append('\\', 2 * slashes).Append('"').ToString();
        }

        /// <summary>The live link, (re)started if the last one ended: one start at a time, after a backoff of 100 ms doubling to 5 s while starts end without any answer.</summary>
        private Link Current() {
            lock (startLock) {
                if (closed) throw new DecideException("closed", "the client was closed");
                if (link != null && link.Failure == null) return link;
                if (link != null) BackOff(link.Answered ? 1 : failures + 1, link.EndedAt);
                link = null;
                TimeSpan wait = notBefore - DateTime.UtcNow;
                if (wait > TimeSpan.Zero) Thread.Sleep(wait);
                try { return link = socketPath != null ? Open() : Start(); }
                catch (DecideException) { BackOff(failures + 1, DateTime.UtcNow); throw; }
            }
        }

        private void BackOff(int failures, DateTime since) {
            this.failures = failures;
            notBefore = since + TimeSpan.FromMilliseconds(Math.Min(100 << Math.Min(failures - 1, 6), 5000));
        }

        private Link Open() {
            var socket = new Socket(AddressFamily.Unix, SocketType.Stream, ProtocolType.Unspecified);
            try { socket.Connect(new UnixEndPoint(socketPath)); }
            catch (SocketException e) { socket.Dispose(); throw new DecideException("start_failed", "cannot connect to " + socketPath + ": " + e.Message); }
            var stream = new NetworkStream(socket, true);
            return new Link(null, socket, stream, stream);
        }

        private Link Start() {
            var info = new ProcessStartInfo(fileName, arguments) {
                UseShellExecute = false, RedirectStandardInput = true, RedirectStandardOutput = true, RedirectStandardError = true,
                CreateNoWindow = true, StandardErrorEncoding = Encoding.UTF8,
            };
            Process process;
            try { process = Process.Start(info); }
            catch (Exception e) when (e is System.ComponentModel.Win32Exception || e is IOException) { throw new DecideException("start_failed", "cannot run " + fileName + ": " + e.Message); }
            var l = new Link(process, null, process.StandardOutput.BaseStream, process.StandardInput.BaseStream);
            Exception failure = null;
            try { if (l.ReadyLine.Wait(readyTimeout)) { Ready = l.ReadyLine.Result; return l; } }
            catch (AggregateException e) { failure = e.InnerException; }
            l.Kill();
            string why = failure != null ? failure.Message : "no ready line within " + readyTimeout.TotalSeconds + " s" + l.StderrNote();
            throw new DecideException("start_failed", "decide did not become ready: " + why);
        }

        /// <summary>A Unix domain socket address, for .NET Standard 2.0 (which has no UnixDomainSocketEndPoint).</summary>
        private sealed class UnixEndPoint : EndPoint {
            private readonly string path;
            public UnixEndPoint(string path) { this.path = path; }
            public override AddressFamily AddressFamily { get { return AddressFamily.Unix; } }
            public override EndPoint Create(SocketAddress address) { return this; }
            public override SocketAddress Serialize() {
                byte[] bytes = Encoding.UTF8.GetBytes(path); // sockaddr_un: the family (2 bytes), then the path, NUL-terminated
                var address = new SocketAddress(AddressFamily.Unix, 2 + bytes.Length + 1);
                for (int i = 0; i < bytes.Length; i++) address[2 + i] = bytes[i];
                return address;
            }
        }

        /// <summary>One child process or socket connection, with its requests in flight in sending order. The protocol answers
        /// every line once, in order: an answer carries our id, or null when decide could not read the line (line_too_long) - then
        /// it is the oldest request's; an id-less busy is the service refusing the connection. A timed-out request stays in
        /// pending, so that its late answer is recognised and dropped.</summary>
        private sealed class Link {
            private readonly Process process;
            private readonly Socket socket;
            private readonly Stream output;
            private readonly SortedDictionary<long, TaskCompletionSource<Answer>> pending = new SortedDictionary<long, TaskCompletionSource<Answer>>();
            private readonly BlockingCollection<byte[]> outbox = new BlockingCollection<byte[]>();
            private readonly TaskCompletionSource<Dictionary<string, object>> ready = new TaskCompletionSource<Dictionary<string, object>>(TaskCreationOptions.RunContinuationsAsynchronously);
            private readonly Thread reader, stderr;
            private long nextId = 1;
            private volatile string lastStderr;
            private volatile bool closing;
            public volatile DecideException Failure;
            public volatile bool Answered;
            public DateTime EndedAt;
            public Task<Dictionary<string, object>> ReadyLine => ready.Task;

            public Link(Process process, Socket socket, Stream input, Stream output) {
                this.process = process;
                this.socket = socket;
                this.output = output;
                if (process == null) ready.SetResult(null); // the socket service sends no ready line
                reader = Daemon("decide-reader", () => Read(input));
                stderr = process == null ? null : Daemon("decide-stderr", DrainStderr);
                Daemon("decide-writer", Write);
            }

            private static Thread Daemon(string name, ThreadStart body) {
                var t = new Thread(body) { Name = name, IsBackground = true };
                t.Start();
                return t;
            }

            public Task<Answer> Request(string text, TimeSpan timeout) {
                var done = new TaskCompletionSource<Answer>(TaskCreationOptions.RunContinuationsAsynchronously);
                lock (this) { // ids, pending order and the line order on the wire agree
                    if (Failure != null) throw new DecideException(Failure.Code, Failure.Message);
                    long id = nextId++;
                    pending[id] = done;
                    outbox.Add(Encoding.UTF8.GetBytes("{\"id\": " + id + ", \"text\": " + Json.Quote(text) + "}\n"));
                }
                var timer = new CancellationTokenSource(timeout);
                timer.Token.Register(() => done.TrySetException(new DecideException("timeout",
                    "no answer within " + timeout.TotalSeconds + " s (decide runs on; a late answer is dropped)")));
                done.Task.ContinueWith(_ => timer.Dispose(), TaskScheduler.Default);
                return done.Task;
            }

            private void Write() {
                var lines = new List<byte[]>();
                try {
                    while (!lines.Contains(Eof)) {
                        lines.Clear();
                        lines.Add(outbox.Take());
                        for (byte[] more; lines.Count < 256 && outbox.TryTake(out more);) lines.Add(more); // many lines, one write
                        foreach (byte[] line in lines) output.Write(line, 0, line.Length);
                        output.Flush();
                    }
                    if (socket != null) socket.Shutdown(SocketShutdown.Send); else output.Close();
                }
                catch (Exception e) when (e is IOException || e is SocketException || e is ObjectDisposedException) {
                    Kill(); // the child or the service is gone: the reader tells every request in flight why
                }
            }

            private void Read(Stream input) {
                var line = new MemoryStream();
                var buffer = new byte[65536];
                try {
                    for (int n; (n = input.Read(buffer, 0, buffer.Length)) > 0;)
                        for (int i = 0; i < n; i++) {
                            if (buffer[i] != '\n') { line.WriteByte(buffer[i]); continue; }
                            string text = Encoding.UTF8.GetString(line.GetBuffer(), 0, (int)line.Length);
                            line.SetLength(0);
                            if (text.Trim().Length > 0) OnLine(text);
                        }
                }
                catch (Exception e) when (e is IOException || e is SocketException || e is ObjectDisposedException) { } // the end, as EOF
                catch (Exception e) when (e is DecideException || e is InvalidCastException || e is NullReferenceException) {
                    // a refusal, a line that is not the protocol's, an answer of another shape: this link is done
                    Fail(e as DecideException ?? new DecideException("protocol_error", "decide wrote an answer this client cannot read: " + e.Message));
                    Kill();
                }
                Fail(Ended());
            }

            private void OnLine(string line) {
                var message = Json.Parse(line) as Dictionary<string, object>;
                if (message == null) throw new DecideException("protocol_error", "decide wrote a line that is not a JSON object: " + line);
                if (!ready.Task.IsCompleted) {
                    if (!"ready".Equals(Get(message, "event"))) throw new DecideException("protocol_error", "expected the ready line, got: " + line);
                    ready.TrySetResult(message);
                    return;
                }
                object id = Get(message, "id");
                var error = Get(message, "error") as Dictionary<string, object>;
                if (id == null && error != null && "busy".Equals(Get(error, "code"))) // the service refuses this connection
                    throw new DecideException("busy", (string)Get(error, "message"));
                TaskCompletionSource<Answer> done = null;
                lock (this) {
                    long key = id is double ? (long)(double)id : id == null && error != null && pending.Count > 0 ? pending.Keys.First() : 0;
                    if (pending.TryGetValue(key, out done)) pending.Remove(key); // (no id: an unreadable line, the oldest's)
                }
                if (done == null) return; // a late answer: its call timed out
                Answered = true;
                if (error != null) { done.TrySetException(new DecideException((string)Get(error, "code"), (string)Get(error, "message"))); return; }
                var answer = new Answer {
                    Label = (string)Get(message, "label"), Leaning = (string)Get(message, "leaning"), Reason = (string)Get(message, "reason"),
                    Score = (double)Get(message, "score"), Abstained = true.Equals(Get(message, "abstained")), Truncated = true.Equals(Get(message, "truncated")),
                };
                foreach (var score in (Dictionary<string, object>)Get(message, "scores")) answer.Scores[score.Key] = (double)score.Value;
                done.TrySetResult(answer);
            }

            private static object Get(Dictionary<string, object> map, string key) => map.TryGetValue(key, out object value) ? value : null;
            private void DrainStderr() {
                try { for (string line; (line = process.StandardError.ReadLine()) != null;) lastStderr = line; }
                catch (Exception e) when (e is IOException || e is ObjectDisposedException) { } // the child is gone
            }
            public string StderrNote() { // once the stderr thread has read what the child wrote
                if (stderr != null) stderr.Join(1000);
                return lastStderr == null ? "" : "; last stderr: " + lastStderr;
            }
            /// <summary>Why the stream ended: the child's exit code and last stderr line, or the service.</summary>
            private DecideException Ended() {
                if (closing) return new DecideException("closed", "the client was closed");
                if (process == null) return new DecideException("connection_lost", "the decide service closed the connection");
                if (!process.WaitForExit(2000)) Kill(); // it closed stdout but lives on
                process.WaitForExit();
                int code = process.ExitCode; // (a signal shows as 128 + its number)
                string signal = code > 128 ? " (signal " + (code - 128) + "?)" : "";
                return new DecideException("connection_lost", "decide exited with code " + code + signal + StderrNote());
            }

            /// <summary>Fail every request in flight (and the ready wait) with error; later requests too.</summary>
            public void Fail(DecideException error) {
                List<TaskCompletionSource<Answer>> waiting;
                lock (this) {
                    if (Failure == null) { Failure = error; EndedAt = DateTime.UtcNow; }
                    waiting = pending.Values.ToList();
                    pending.Clear();
                }
                outbox.Add(Eof); // the writer ends
                ready.TrySetException(Failure);
                foreach (var done in waiting) done.TrySetException(Failure);
            }
            public void Kill() {
                try { if (process != null) { if (!process.HasExited) process.Kill(); } else socket.Close(); }
                catch (Exception e) when (e is InvalidOperationException || e is System.ComponentModel.Win32Exception) { } // gone already
            }
            /// <summary>EOF after the queued lines; decide answers what it read and exits (the service closes).</summary>
            public void Close(TimeSpan timeout) {
                closing = true;
                outbox.Add(Eof);
                if (process != null) process.WaitForExit((int)timeout.TotalMilliseconds);
                if (process != null) Kill(); // (no SIGTERM in .NET Standard: decide answers on EOF alone)
                reader.Join(timeout);
                Kill();
                Fail(new DecideException("closed", "the client was closed"));
            }
        }

        /// <summary>Just enough JSON: objects, arrays, strings, numbers (as double), true/false/null.</summary>
        private sealed class Json {
            private readonly string s;
            private int i;
            private Json(string s) { this.s = s; }
            /// <summary>The value of a JSON text, or null if it is not JSON.</summary>
            public static object Parse(string text) {
                var j = new Json(text);
                try { object value = j.Value(); return j.Eat("") && j.i == text.Length ? value : null; }
                catch (Exception e) when (e is FormatException || e is IndexOutOfRangeException || e is ArgumentException) { return null; }
            }

            public static string Quote(string text) {
                var b = new StringBuilder(text.Length + 2).Append('"');
                foreach (char c in text) {
                    if (c == '"' || c == '\\') b.Append('\\');
                    if (c < 0x20) b.Append("\\u").Append(((int)c).ToString("x4")); else b.Append(c);
                }
                return b.Append('"').ToString();
            }
            private bool Eat(string w) { // whitespace, then w if it is there
                while (i < s.Length && " \t\r\n".IndexOf(s[i]) >= 0) i++;
                return string.CompareOrdinal(s, i, w, 0, w.Length) == 0 && (i += w.Length) >= 0;
            }
            private object Expect(string end, object value) { if (Eat(end)) return value; throw new FormatException(end + " expected"); }
            private object Value() {
                if (Eat("{")) {
                    var map = new Dictionary<string, object>();
                    if (Eat("}")) return map;
                    do {
                        if (!Eat("\"")) throw new FormatException("a key expected");
                        string key = String();
                        if (!Eat(":")) throw new FormatException("':' expected");
                        map[key] = Value();
                    } while (Eat(","));
                    return Expect("}", map);
                }
                if (Eat("[")) {
                    var list = new List<object>();
                    if (Eat("]")) return list;
                    do list.Add(Value()); while (Eat(","));
                    return Expect("]", list);
                }
                if (Eat("\"")) return String();
                if (Eat("true")) return true;
                if (Eat("false")) return false;
                if (Eat("null")) return null;
                int start = i;
                while (i < s.Length && "+-0123456789.eE".IndexOf(s[i]) >= 0) i++;
                return double.Parse(s.Substring(start, i - start), NumberStyles.Float, CultureInfo.InvariantCulture);
            }

            private string String() { // after the opening quote
                var b = new StringBuilder();
                for (char c; (c = s[i++]) != '"';) {
                    if (c != '\\') { b.Append(c); continue; }
                    int at = "\"\\/bfnrt".IndexOf(c = s[i++]);
                    if (at >= 0) b.Append("\"\\/\b\f\n\r\t"[at]);
                    else if (c == 'u') { b.Append((char)int.Parse(s.Substring(i, 4), NumberStyles.HexNumber, CultureInfo.InvariantCulture)); i += 4; }
                    else throw new FormatException("bad escape");
                }
                return b.ToString();
            }
        }
    }
}
