//! OCI registry client: probe and delete the `<vm>:hibernate` snapshot tag.
//! (Skeleton: the implementation lands with the registry work.)
