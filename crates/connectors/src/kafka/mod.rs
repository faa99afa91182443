//! Kafka through librdkafka (`rdkafka`): a split source whose splits are a
//! topic's partitions ([`KafkaSource`]), and a sink that delivers at least
//! once or exactly once ([`KafkaSink`]).
//!
//! URLs: `kafka://HOST:PORT[,HOST:PORT…]/TOPIC?OPTIONS`. Options starting
//! with `kafka.` go to librdkafka as they are (`kafka.security.protocol=ssl`),
//! so whatever a cluster needs can be set without a new option here.

mod epochs;
mod sink;
mod source;

#[cfg(test)]
mod against_broker;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;

pub use sink::{Delivery, KafkaSink, KafkaSinkOptions};
pub use source::{
    KafkaSource, KafkaSourceOptions, KafkaSplit, KnownPartitions, StartAt, ValueFormat,
};

use rdkafka::ClientConfig;
use std::time::Duration;
use thiserror::Error;

/// A Kafka source or sink that cannot be set up.
#[derive(Debug, Error)]
pub enum KafkaError {
    /// The URL or one of its options is wrong.
    #[error("kafka {url}: {problem}")]
    Url {
        /// The URL, as given.
        url: String,
        /// What is wrong.
        problem: String,
    },
    /// librdkafka refused a setting or a call.
    #[error("kafka {topic}: {what}: {source}")]
    Client {
        /// The topic.
        topic: String,
        /// What was being done.
        what: String,
        /// librdkafka's error (boxed: it is large).
        #[source]
        source: Box<rdkafka::error::KafkaError>,
    },
}

/// Which cluster and topic, and the client settings given with them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// `bootstrap.servers`: `HOST:PORT[,HOST:PORT…]`.
    pub brokers: String,
    /// The topic.
    pub topic: String,
    /// librdkafka settings, applied after Tidemark's own.
    pub properties: Vec<(String, String)>,
    /// How long a metadata request, a flush or a transaction call may take.
    pub timeout: Duration,
}

impl Endpoint {
    /// The endpoint of `url` and its options other than `kafka.*` and
    /// `timeout`, in order, for the source or sink to read.
    pub fn parse(url: &str) -> Result<(Self, Vec<(String, String)>), KafkaError> {
        let problem = |problem: String| KafkaError::Url {
            url: url.to_owned(),
            problem,
        };
        let rest = url
            .strip_prefix("kafka://")
            .ok_or_else(|| problem("expected kafka://HOST:PORT/TOPIC".into()))?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (brokers, topic) = path
            .split_once('/')
            .filter(|(brokers, topic)| !brokers.is_empty() && !topic.is_empty())
            .ok_or_else(|| problem("expected kafka://HOST:PORT/TOPIC".into()))?;
        if topic.contains('/') {
            return Err(problem(format!("{topic:?} is not a topic name")));
        }
        let mut endpoint = Endpoint {
            brokers: brokers.to_owned(),
            topic: topic.to_owned(),
            properties: Vec::new(),
            timeout: Duration::from_secs(30),
        };
        let mut options = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| problem(format!("{pair:?} is not KEY=VALUE")))?;
            if let Some(property) = key.strip_prefix("kafka.") {
                endpoint.properties.push((property.into(), value.into()));
            } else if key == "timeout" {
                endpoint.timeout = humantime::parse_duration(value)
                    .map_err(|e| problem(format!("timeout={value}: {e}")))?;
            } else {
                options.push((key.to_owned(), value.to_owned()));
            }
        }
        Ok((endpoint, options))
    }

    /// A client's settings: the brokers, then `settings`, then the user's
    /// properties, which win.
    fn config(&self, settings: &[(&str, &str)]) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.brokers);
        for (key, value) in settings {
            config.set(*key, *value);
        }
        for (key, value) in &self.properties {
            config.set(key, value);
        }
        config
    }

    fn error(
        &self,
        what: impl Into<String>,
    ) -> impl FnOnce(rdkafka::error::KafkaError) -> KafkaError {
        let topic = self.topic.clone();
        let what = what.into();
        move |source| KafkaError::Client {
            topic,
            what,
            source: Box::new(source),
        }
    }
}

/// An option the source or sink does not know.
fn unknown(url: &str, key: &str, known: &str) -> KafkaError {
    KafkaError::Url {
        url: url.to_owned(),
        problem: format!("unknown option {key:?} (known: {known}, timeout, kafka.*)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_names_brokers_topic_and_passes_kafka_settings_through() {
        let (endpoint, options) = Endpoint::parse(
            "kafka://a:9092,b:9092/events?format=text&kafka.security.protocol=ssl&timeout=5s",
        )
        .unwrap();
        assert_eq!(endpoint.brokers, "a:9092,b:9092");
        assert_eq!(endpoint.topic, "events");
        assert_eq!(
            endpoint.properties,
            [("security.protocol".to_owned(), "ssl".to_owned())]
        );
        assert_eq!(endpoint.timeout, Duration::from_secs(5));
        assert_eq!(options, [("format".to_owned(), "text".to_owned())]);
    }

    #[test]
    fn a_url_without_a_topic_or_with_a_bad_option_is_refused_naming_it() {
        for (url, named) in [
            ("kafka://a:9092", "kafka://HOST:PORT/TOPIC"),
            ("kafka://a:9092/", "kafka://HOST:PORT/TOPIC"),
            ("kafka:///events", "kafka://HOST:PORT/TOPIC"),
            ("kafka://a:9092/x/y", "\"x/y\" is not a topic name"),
            ("kafka://a:9092/t?timeout", "\"timeout\" is not KEY=VALUE"),
            ("kafka://a:9092/t?timeout=soon", "timeout=soon"),
        ] {
            let error = Endpoint::parse(url).unwrap_err().to_string();
            assert!(error.contains(named), "{url}: {error}");
        }
    }
}
