//! The few writes the product makes besides deletes: the owner marker's blob and
//! manifest (S10), and the read of a marker's manifest.

use super::{Session, header};
use crate::error::{Op, RegistryError, Result};
use reqwest::{Method, Url};

const OP_BLOB: Op = "push_blob";

impl Session<'_> {
    /// GET `<repository>/manifests/<reference>`: its body, None on 404.
    pub async fn get_manifest(&mut self, path: &str, op: Op) -> Result<Option<String>> {
        let answer = self.send(Method::GET, &self.url(path)?, op).await;
        let result = answer.and_then(|(status, _, body)| match status {
            200 => Ok(Some(body)),
            404 => Ok(None),
            status => Err(RegistryError::from_status(op, status, &body)),
        });
        let outcome = |b: &Option<_>| if b.is_some() { "present" } else { "absent" };
        self.http.counted(op, result, outcome)
    }

    /// Uploads `data` as blob `digest` of `repository`, unless it is there already: a
    /// POST opens the upload, one PUT at its `Location` (same origin only) ends it.
    pub async fn ensure_blob(&mut self, repository: &str, digest: &str, data: &[u8]) -> Result<()> {
        let result = self.upload(repository, digest, data).await;
        self.http.counted(OP_BLOB, result, |_| "ok")
    }

    async fn upload(&mut self, repository: &str, digest: &str, data: &[u8]) -> Result<()> {
        const OP: Op = OP_BLOB;
        let blob = self.url(&format!("{repository}/blobs/{digest}"))?;
        let (status, _, body) = self.send(Method::HEAD, &blob, OP).await?;
        match status {
            200 => return Ok(()),
            404 => {}
            status => return Err(RegistryError::from_status(OP, status, &body)),
        }
        let start = self.url(&format!("{repository}/blobs/uploads/"))?;
        let (status, headers, body) = self.send(Method::POST, &start, OP).await?;
        if status != 202 {
            return Err(RegistryError::from_status(OP, status, &body));
        }
        let location = header(&headers, "location")
            .ok_or_else(|| RegistryError::protocol(OP, "the upload answer has no Location"))?;
        let mut upload =
            upload_url(&start, &location).map_err(|m| RegistryError::protocol(OP, m))?;
        upload.query_pairs_mut().append_pair("digest", digest);
        let octets = Some(("application/octet-stream", data));
        match self.send_with(Method::PUT, &upload, OP, octets).await? {
            (201 | 204, _, _) => Ok(()),
            (status, _, body) => Err(RegistryError::from_status(OP, status, &body)),
        }
    }

    /// PUT `<repository>/manifests/<tag>` with `data` of type `media_type`.
    pub async fn put_manifest(&mut self, path: &str, media_type: &str, data: &[u8]) -> Result<()> {
        const OP: Op = "push_manifest";
        let url = self.url(path)?;
        let answer = self
            .send_with(Method::PUT, &url, OP, Some((media_type, data)))
            .await;
        let result = answer.and_then(|(status, _, body)| match status {
            200 | 201 | 204 => Ok(()),
            status => Err(RegistryError::from_status(OP, status, &body)),
        });
        self.http.counted(OP, result, |_| "ok")
    }
}

/// Where an upload goes on: `location` against the URL that opened it, on the same
/// origin only, so credentials never follow it elsewhere.
fn upload_url(start: &Url, location: &str) -> Result<Url, String> {
    match start.join(location) {
        Ok(next) if next.origin() == start.origin() => Ok(next),
        Ok(_) => Err(format!(
            "the upload Location {location:?} leaves the registry"
        )),
        Err(e) => Err(format!("unusable upload Location {location:?}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upload_locations_stay_on_the_registry() {
        let start = Url::parse("http://reg:5000/v2/p/owner/blobs/uploads/").unwrap();
        let relative = upload_url(&start, "/v2/p/owner/blobs/uploads/u1?_state=x").unwrap();
        assert_eq!(
            relative.as_str(),
            "http://reg:5000/v2/p/owner/blobs/uploads/u1?_state=x"
        );
        let absolute = upload_url(&start, "http://reg:5000/v2/p/owner/blobs/uploads/u2").unwrap();
        assert_eq!(absolute.path(), "/v2/p/owner/blobs/uploads/u2");
        assert!(upload_url(&start, "http://elsewhere/v2/x").is_err());
    }
}
