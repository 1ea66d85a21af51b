"""The one Kafka/Faust layer: the Faust app and its topics (app), topic creation and checks
(topic_admin), reading a topic to its end (topic_reader), confirmed delivery of produced
records (delivery), and the patches and glue that fit keylane's lanes and offsets into
Faust (faust_glue)."""
