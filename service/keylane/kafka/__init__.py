"""The one Kafka/Faust layer: nothing outside this package imports faust, mode or aiokafka.

The Faust app, its signals and hooks (app), topic creation and checks (topic_admin), reading
a topic to its end (topic_reader), a plain producer for one-off records (producer), confirmed
delivery of produced records (delivery), publishing to catalog topics (publish), Kafka's
default partitioner (partitioner), feeding stream records into lanes (lane_feed), the offset
ledger's hold on input topics (offset_guard), and every patch of Faust internals (patches)."""
