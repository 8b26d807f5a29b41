// The Java client's conformance harness: the command language of tests/clients/harness.py.
import decide.DecideClient;
import decide.DecideClient.Answer;
import decide.DecideClient.DecideException;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.function.Supplier;

public final class Harness {
    private static final Map<String, DecideClient> CLIENTS = new HashMap<>();

    private static String json(Object value) {
        if (value == null) return "null";
        if (value instanceof Boolean || value instanceof Number) return value.toString();
        StringBuilder b = new StringBuilder("\"");
        for (char c : value.toString().toCharArray()) {
            if (c == '"' || c == '\\') b.append('\\').append(c);
            else if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
            else b.append(c);
        }
        return b.append('"').toString();
    }

    private static List<String> lines(String path) throws IOException {
        String text = new String(Files.readAllBytes(Paths.get(path)), StandardCharsets.UTF_8);
        List<String> lines = new ArrayList<>(Arrays.asList(text.split("\n", -1)));
        lines.remove(lines.size() - 1);
        return lines;
    }

    private static String labelOrCode(Supplier<Answer> call) {
        try {
            return json(call.get().label);
        } catch (DecideException e) {
            return json("!" + e.code() + ": " + e.getMessage());
        } catch (CompletionException e) {
            return json("!" + ((DecideException) e.getCause()).code() + ": " + e.getCause().getMessage());
        }
    }

    private static String labels(List<String> labels) { return "\"labels\": [" + String.join(", ", labels) + "], "; }

    private static String run(String[] f) throws Exception {
        DecideClient client = CLIENTS.get(f.length > 1 ? f[1] : "");
        switch (f[0]) {
            case "spawn":
                long ready = (long) (Double.parseDouble(f[2]) * 1000), timeout = (long) (Double.parseDouble(f[3]) * 1000);
                CLIENTS.put(f[1], DecideClient.spawn(Arrays.asList(f).subList(4, f.length), timeout, ready));
                return "";
            case "connect":
                CLIENTS.put(f[1], DecideClient.connect(f[3], (long) (Double.parseDouble(f[2]) * 1000)));
                return "";
            case "one": {
                StringBuilder text = new StringBuilder();
                for (int i = Integer.parseInt(f[2]); i > 0; i--) text.append(f[3]);
                Answer a = client.classify(text.toString());
                return "\"label\": " + json(a.label) + ", \"leaning\": " + json(a.leaning) + ", \"score\": " + a.score
                    + ", \"abstained\": " + a.abstained + ", \"reason\": " + json(a.reason) + ", \"truncated\": " + a.truncated + ", ";
            }
            case "many": {
                List<String> out = new ArrayList<>();
                for (Answer a : client.classifyMany(lines(f[2]))) out.add(json(a.label));
                return labels(out);
            }
            case "async": {
                List<CompletableFuture<Answer>> futures = new ArrayList<>();
                for (String text : lines(f[2])) futures.add(client.classifyAsync(text, 60_000));
                if (f.length > 3 && f[3].equals("inflight")) System.out.println("{\"event\": \"inflight\"}");
                List<String> out = new ArrayList<>();
                for (CompletableFuture<Answer> future : futures) out.add(labelOrCode(future::join));
                return labels(out);
            }
            case "threads": {
                int n = Integer.parseInt(f[2]), m = Integer.parseInt(f[3]);
                List<String> texts = lines(f[4]);
                String[] out = new String[n * m];
                List<Thread> threads = new ArrayList<>();
                for (int t = 0; t < n; t++) {
                    final int first = t * m;
                    threads.add(new Thread(() -> {
                        for (int j = first; j < first + m; j++) { final int i = j; out[i] = labelOrCode(() -> client.classify(texts.get(i % texts.size()))); }
                    }));
                }
                for (Thread t : threads) t.start();
                for (Thread t : threads) t.join();
                return labels(Arrays.asList(out));
            }
            case "sleep":
                Thread.sleep(Long.parseLong(f[1]));
                return "";
            case "close":
                client.close(); // kept: later calls must throw "closed"
                return "";
            default:
                throw new IllegalArgumentException("unknown command " + f[0]);
        }
    }

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        for (String line; (line = in.readLine()) != null;) {
            String[] fields = line.split("\t", -1);
            long started = System.nanoTime();
            String result;
            try {
                result = run(fields);
            } catch (DecideException e) {
                result = "\"error_code\": " + json(e.code()) + ", \"error_message\": " + json(e.getMessage()) + ", ";
            }
            System.out.println("{" + result + "\"cmd\": " + json(fields[0]) + ", \"elapsed_ms\": " + (System.nanoTime() - started) / 1e6 + "}");
            System.out.flush();
        }
        for (DecideClient client : CLIENTS.values()) client.close();
    }
}
