// Kafka's own client on a native share group (KIP-932), for tests/integration/test_parity.py:
// a member acknowledges records after its lock elapsed and another member finished them.
// Run in Java's source-file mode: java -cp '<kafka libs>/*' LateAcknowledgement.java BOOTSTRAP TOPIC GROUP
// Prints one line per step: "held", "finished", "late-commit", "callback" (from close()), "closed".
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicIdPartition;

public class LateAcknowledgement {
    static KafkaShareConsumer<byte[], byte[]> member(String bootstrap, String group) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("group.id", group);
        p.put("key.deserializer", "org.apache.kafka.common.serialization.ByteArrayDeserializer");
        p.put("value.deserializer", "org.apache.kafka.common.serialization.ByteArrayDeserializer");
        p.put("share.acknowledgement.mode", "explicit");
        return new KafkaShareConsumer<>(p);
    }

    public static void main(String[] args) {
        String bootstrap = args[0], topic = args[1], group = args[2];
        long deadline = System.currentTimeMillis() + 60_000;
        KafkaShareConsumer<byte[], byte[]> late = member(bootstrap, group);
        late.setAcknowledgementCommitCallback(
                (offsets, exception) -> System.out.println("callback " + offsets.values() + " " + exception));
        late.subscribe(List.of(topic));
        List<ConsumerRecord<byte[], byte[]>> held = new ArrayList<>();
        while (held.size() < 2 && System.currentTimeMillis() < deadline) {
            late.poll(Duration.ofMillis(500)).forEach(held::add);
        }
        System.out.println("held " + held.stream().map(ConsumerRecord::offset).toList());
        try (KafkaShareConsumer<byte[], byte[]> other = member(bootstrap, group)) {
            other.subscribe(List.of(topic));
            int finished = 0;
            while (finished < held.size() && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<byte[], byte[]> r : other.poll(Duration.ofMillis(500))) {
                    other.acknowledge(r, AcknowledgeType.ACCEPT);
                    finished++;
                }
            }
            System.out.println("finished " + finished + " " + other.commitSync().values());
        }
        late.acknowledge(held.get(0), AcknowledgeType.ACCEPT);
        Map<TopicIdPartition, Optional<KafkaException>> result = late.commitSync();
        System.out.println("late-commit " + result.values());
        late.acknowledge(held.get(1), AcknowledgeType.REJECT);
        late.close();
        System.out.println("closed");
    }
}
