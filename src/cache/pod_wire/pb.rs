//! The protobuf messages of a pod watch: the fields the product reads, with their numbers
//! from k8s.io/api and k8s.io/apimachinery `generated.proto` (v1.34).

#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchEvent {
    #[prost(string, tag = "1")]
    pub r#type: String,
    #[prost(message, optional, tag = "2")]
    pub object: Option<RawExtension>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RawExtension {
    #[prost(bytes = "vec", tag = "1")]
    pub raw: Vec<u8>,
}

/// `runtime.Unknown`: the envelope after the magic.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Unknown {
    #[prost(bytes = "vec", tag = "2")]
    pub raw: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Pod {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "3")]
    pub status: Option<PodStatus>,
}

/// All of `ObjectMeta` but `managedFields` (17).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ObjectMeta {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub generate_name: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub namespace: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub self_link: Option<String>,
    #[prost(string, optional, tag = "5")]
    pub uid: Option<String>,
    #[prost(string, optional, tag = "6")]
    pub resource_version: Option<String>,
    #[prost(int64, optional, tag = "7")]
    pub generation: Option<i64>,
    #[prost(message, optional, tag = "8")]
    pub creation_timestamp: Option<Time>,
    #[prost(message, optional, tag = "9")]
    pub deletion_timestamp: Option<Time>,
    #[prost(int64, optional, tag = "10")]
    pub deletion_grace_period_seconds: Option<i64>,
    #[prost(btree_map = "string, string", tag = "11")]
    pub labels: std::collections::BTreeMap<String, String>,
    #[prost(btree_map = "string, string", tag = "12")]
    pub annotations: std::collections::BTreeMap<String, String>,
    #[prost(message, repeated, tag = "13")]
    pub owner_references: Vec<OwnerReference>,
    #[prost(string, repeated, tag = "14")]
    pub finalizers: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Time {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct OwnerReference {
    #[prost(string, tag = "1")]
    pub kind: String,
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(string, tag = "4")]
    pub uid: String,
    #[prost(string, tag = "5")]
    pub api_version: String,
    #[prost(bool, optional, tag = "6")]
    pub controller: Option<bool>,
    #[prost(bool, optional, tag = "7")]
    pub block_owner_deletion: Option<bool>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodStatus {
    #[prost(message, repeated, tag = "8")]
    pub container_statuses: Vec<ContainerStatus>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatus {
    #[prost(message, optional, tag = "2")]
    pub state: Option<ContainerState>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerState {
    #[prost(message, optional, tag = "2")]
    pub running: Option<Empty>,
}

/// A message whose fields are all skipped.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Status {
    #[prost(string, optional, tag = "2")]
    pub status: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub message: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub reason: Option<String>,
    #[prost(int32, optional, tag = "6")]
    pub code: Option<i32>,
}
