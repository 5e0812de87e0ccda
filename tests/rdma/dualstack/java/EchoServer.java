import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.util.Iterator;

/**
 * NIO echo server for tests/rdma/dualstack.sh: binds the wildcard on PORT (the JVM opens an
 * AF_INET6 socket on [::], dual-stack), echoes COUNT connections through one selector (epoll),
 * each until the peer's EOF, then exits. Prints each peer as the JVM sees it.
 *
 * usage: java EchoServer PORT COUNT
 */
public class EchoServer {
    /** One connection: its echo buffer, and whether the peer has finished sending. */
    static final class Conn {
        final ByteBuffer buf = ByteBuffer.allocateDirect(1 << 16);
        boolean eof;
    }

    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(args[0]);
        int count = Integer.parseInt(args[1]);
        Selector sel = Selector.open();
        ServerSocketChannel ss = ServerSocketChannel.open();
        ss.bind(new InetSocketAddress(port));
        ss.configureBlocking(false);
        ss.register(sel, SelectionKey.OP_ACCEPT);
        System.out.println("listening " + ss.getLocalAddress());
        int done = 0;
        while (done < count) {
            sel.select();
            for (Iterator<SelectionKey> it = sel.selectedKeys().iterator(); it.hasNext(); ) {
                SelectionKey k = it.next();
                it.remove();
                if (k.isAcceptable()) {
                    SocketChannel c = ss.accept();
                    if (c == null) continue;
                    c.configureBlocking(false);
                    System.out.println("accepted " + c.getRemoteAddress() + " on " + c.getLocalAddress());
                    c.register(sel, SelectionKey.OP_READ, new Conn());
                } else if (step((SocketChannel) k.channel(), k, (Conn) k.attachment())) {
                    done++;
                }
            }
        }
        System.out.println("served " + done);
    }

    /** Moves what it can; returns true once the connection is echoed and closed. */
    static boolean step(SocketChannel c, SelectionKey k, Conn s) throws Exception {
        if (k.isReadable() && s.buf.hasRemaining() && !s.eof) {
            if (c.read(s.buf) < 0) s.eof = true;
        }
        s.buf.flip();
        c.write(s.buf);
        s.buf.compact();
        boolean pending = s.buf.position() > 0;
        if (s.eof && !pending) {
            c.shutdownOutput();
            c.close();
            return true;
        }
        int ops = 0;
        if (pending) ops |= SelectionKey.OP_WRITE;
        if (!s.eof && s.buf.hasRemaining()) ops |= SelectionKey.OP_READ;
        k.interestOps(ops);
        return false;
    }
}
