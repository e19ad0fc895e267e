// socklane bench: a ping-pong over Java's blocking sockets (java.net.Socket,
// whose streams read and write in blocking mode), run as a single source file.
//
//   java PingPong.java server PORT
//   java PingPong.java client HOST PORT SIZE COUNT
//
// The client prints the mean round trip in microseconds ("rtt_us=...").
import java.io.DataInputStream;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;

public class PingPong {
    public static void main(String[] args) throws Exception {
        if (args.length >= 2 && args[0].equals("server")) {
            serve(Integer.parseInt(args[1]));
        } else if (args.length >= 5 && args[0].equals("client")) {
            ping(args[1], Integer.parseInt(args[2]), Integer.parseInt(args[3]), Integer.parseInt(args[4]));
        } else {
            System.err.println("usage: PingPong server PORT | client HOST PORT SIZE COUNT");
            System.exit(2);
        }
    }

    // serve echoes each connection's bytes back, one thread a connection.
    static void serve(int port) throws Exception {
        try (ServerSocket ss = new ServerSocket()) {
            ss.setReuseAddress(true);
            ss.bind(new InetSocketAddress(port));
            for (;;) {
                Socket s = ss.accept();
                s.setTcpNoDelay(true);
                Thread t = new Thread(() -> echo(s));
                t.setDaemon(true);
                t.start();
            }
        }
    }

    static void echo(Socket s) {
        byte[] buf = new byte[65536];
        try (s; InputStream in = s.getInputStream(); OutputStream out = s.getOutputStream()) {
            int n;
            while ((n = in.read(buf)) > 0) {
                out.write(buf, 0, n);
            }
        } catch (Exception e) {
            // the client went away
        }
    }

    // ping sends count messages of size bytes, each after the last one's
    // echo was read in full, and checks every echo.
    static void ping(String host, int port, int size, int count) throws Exception {
        byte[] msg = new byte[size];
        byte[] back = new byte[size];
        try (Socket s = new Socket(host, port)) {
            s.setTcpNoDelay(true);
            OutputStream out = s.getOutputStream();
            DataInputStream in = new DataInputStream(s.getInputStream());
            int warmup = Math.min(1000, count / 10 + 1);
            long start = 0;
            for (int i = 0; i < warmup + count; i++) {
                if (i == warmup) {
                    start = System.nanoTime();
                }
                msg[0] = (byte) i;
                msg[size - 1] = (byte) (i >> 8);
                out.write(msg);
                in.readFully(back);
                if (back[0] != msg[0] || back[size - 1] != msg[size - 1]) {
                    throw new IllegalStateException("echo " + i + " differs");
                }
            }
            double us = (System.nanoTime() - start) / 1e3 / count;
            System.out.printf("rtt_us=%.3f%n", us);
        }
    }
}
