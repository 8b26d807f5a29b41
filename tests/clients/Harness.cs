// The C# client's conformance harness: the command language of tests/clients/harness.py.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Globalization;
using System.IO;
using System.Linq;
using System.Text;
using System.Threading;
using System.Threading.Tasks;
using Decide;

public static class Harness {
    private static readonly Dictionary<string, DecideClient> Clients = new Dictionary<string, DecideClient>();

    private static string Json(object value) {
        if (value == null) return "null";
        if (value is bool) return (bool)value ? "true" : "false";
        if (value is double) return ((double)value).ToString("R", CultureInfo.InvariantCulture);
        var b = new StringBuilder("\"");
        foreach (char c in value.ToString()) {
            if (c == '"' || c == '\\') b.Append('\\');
            if (c < 0x20) b.Append("\\u").Append(((int)c).ToString("x4")); else b.Append(c);
        }
        return b.Append('"').ToString();
    }

    private static List<string> Lines(string path) {
        var lines = File.ReadAllText(path, new UTF8Encoding(false)).Split('\n').ToList();
        lines.RemoveAt(lines.Count - 1);
        return lines;
    }

    private static string LabelOrCode(Func<Answer> call) {
        try { return Json(call().Label); }
        catch (DecideException e) { return Json("!" + e.Code + ": " + e.Message); }
    }

    private static string Labels(IEnumerable<string> labels) { return "\"labels\": [" + string.Join(", ", labels) + "], "; }

    private static TimeSpan Seconds(string s) { return TimeSpan.FromSeconds(double.Parse(s, CultureInfo.InvariantCulture)); }

    private static string Run(string[] f) {
        DecideClient client;
        Clients.TryGetValue(f.Length > 1 ? f[1] : "", out client);
        switch (f[0]) {
            case "spawn":
                Clients[f[1]] = DecideClient.Spawn(f[4], f.Skip(5), Seconds(f[3]), Seconds(f[2]));
                return "";
            case "connect":
                Clients[f[1]] = DecideClient.Connect(f[3], Seconds(f[2]));
                return "";
            case "one": {
                var text = new StringBuilder();
                for (int i = int.Parse(f[2]); i > 0; i--) text.Append(f[3]);
                Answer a = client.Classify(text.ToString());
                return "\"label\": " + Json(a.Label) + ", \"leaning\": " + Json(a.Leaning) + ", \"score\": " + Json(a.Score)
                    + ", \"abstained\": " + Json(a.Abstained) + ", \"reason\": " + Json(a.Reason) + ", \"truncated\": " + Json(a.Truncated) + ", ";
            }
            case "many":
                return Labels(client.ClassifyMany(Lines(f[2])).Select(a => Json(a.Label)));
            case "async": {
                List<Task<Answer>> tasks = Lines(f[2]).Select(text => client.ClassifyAsync(text)).ToList();
                if (f.Length > 3 && f[3] == "inflight") Console.WriteLine("{\"event\": \"inflight\"}");
                return Labels(tasks.Select(task => LabelOrCode(() => task.GetAwaiter().GetResult())).ToList());
            }
            case "threads": {
                int n = int.Parse(f[2]), m = int.Parse(f[3]);
                List<string> texts = Lines(f[4]);
                var labels = new string[n * m];
                var threads = Enumerable.Range(0, n).Select(t => new Thread(() => {
                    for (int j = t * m; j < t * m + m; j++) { int i = j; labels[i] = LabelOrCode(() => client.Classify(texts[i % texts.Count])); }
                })).ToList();
                threads.ForEach(t => t.Start());
                threads.ForEach(t => t.Join());
                return Labels(labels);
            }
            case "sleep":
                Thread.Sleep(int.Parse(f[1]));
                return "";
            case "close":
                client.Dispose(); // kept: later calls must throw "closed"
                return "";
            default:
                throw new ArgumentException("unknown command " + f[0]);
        }
    }

    public static void Main() {
        var stdin = new StreamReader(Console.OpenStandardInput(), new UTF8Encoding(false));
        var stdout = new StreamWriter(Console.OpenStandardOutput(), new UTF8Encoding(false)) { AutoFlush = true };
        Console.SetOut(stdout);
        for (string line; (line = stdin.ReadLine()) != null;) {
            string[] fields = line.Split('\t');
            var watch = Stopwatch.StartNew();
            string result;
            try { result = Run(fields); }
            catch (DecideException e) { result = "\"error_code\": " + Json(e.Code) + ", \"error_message\": " + Json(e.Message) + ", "; }
            Console.WriteLine("{" + result + "\"cmd\": " + Json(fields[0]) + ", \"elapsed_ms\": " + Json(watch.Elapsed.TotalMilliseconds) + "}");
        }
        foreach (var client in Clients.Values) client.Dispose();
    }
}
