//! The data plane of an attempt: the subtask actors and the asynchronous
//! part of their snapshots, the channel endpoints between them, the TCP
//! links that carry channels between workers, the wiring of an attempt's
//! channels, and the host of the source coordinators that hand subtasks
//! their splits. It knows nothing of checkpoint coordination or of how
//! attempts are deployed: the layers above drive it through messages.

pub mod channels;
pub mod endpoint;
pub mod net;
pub mod snapshot;
pub mod sources;
pub mod subtask;
