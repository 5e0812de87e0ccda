import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.Socket;
import java.util.concurrent.atomic.AtomicReference;

/**
 * Blocking echo client for tests/rdma/dualstack.sh: sends INFILE from a second thread while
 * reading the echo into OUTFILE, half-closes after the last byte, reads to EOF. The JVM's
 * socket is AF_INET6, so an IPv4 HOST is connected as ::ffff:a.b.c.d.
 *
 * usage: java EchoClient HOST PORT INFILE OUTFILE
 */
public class EchoClient {
    public static void main(String[] args) throws Exception {
        Socket s = new Socket(args[0], Integer.parseInt(args[1]));
        System.out.println("connected " + s.getLocalSocketAddress() + " -> " + s.getRemoteSocketAddress());
        AtomicReference<Exception> failed = new AtomicReference<>();
        Thread sender = new Thread(() -> {
            try (InputStream in = new FileInputStream(args[2])) {
                in.transferTo(s.getOutputStream());
                s.shutdownOutput();
            } catch (Exception e) {
                failed.set(e);
            }
        });
        sender.start();
        long n;
        try (OutputStream out = new FileOutputStream(args[3])) {
            n = s.getInputStream().transferTo(out);
        }
        sender.join();
        s.close();
        if (failed.get() != null) throw failed.get();
        System.out.println("echoed " + n);
    }
}
